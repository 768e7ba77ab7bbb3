#!/usr/bin/env bash
# The warp-specialized FP8-row attention kernel: its tests, the kernel sweep against the one-role kernel, the PDL
# tests of the attention, the decode step (main's tree, then this one) at batch 128 / 256, 4K.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r5; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/sparse_attention*.py; git log --oneline -1 2>/dev/null; } > $R/env.txt 2>&1
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 110 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
bench $ROOT/bench_tmp/base base_32k "grid.bench.batch=[128]" "grid.bench.context=[32768]"
[ $(el) -lt 200 ] && bench $ROOT new_32k "grid.bench.batch=[128]" "grid.bench.context=[32768]"
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r5.tgz r5 && rm -rf r5 && ls -la $OUT

