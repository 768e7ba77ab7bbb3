#!/usr/bin/env bash
# Index entries as int64 low words (no loader spills): Gluon attention tests, kernel A/B + timeline, PDL tests, step.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/sparse_attention*.py bench_tmp/base/tp_runtime/ops/sparse_attention*.py; } > $R/env.txt 2>&1
timeout -k 10 -s INT 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_attention_wgmma_gpu.py \
  > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt; tail -3 $R/tests.log
timeout -k 10 200 python3 bench_tmp/diag/diag.py base,lw,tllw \
  128/4096/4/64,128/4096/128/64,256/4096/4/64,256/4096/128/64,128/32768/4/64,128/4096/4/32 > $R/diag.log 2>&1
echo "diag rc=$? $(el) s" >> $R/env.txt; cat $R/diag.log
timeout -k 10 -s INT 100 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_pdl_gpu.py -k sparse_attention \
  > $R/pdl.log 2>&1
echo "pdl rc=$? $(el) s" >> $R/env.txt; tail -2 $R/pdl.log
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 110 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
[ $(el) -lt 300 ] && bench $ROOT/bench_tmp/base base_1 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
[ $(el) -lt 390 ] && bench $ROOT new_1 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
[ $(el) -lt 470 ] && bench $ROOT/bench_tmp/base base_s8 "grid.bench.batch=[128]" "grid.bench.context=[4096]" "grid.shard_of_tp=[8]"
[ $(el) -lt 540 ] && bench $ROOT new_s8 "grid.bench.batch=[128]" "grid.bench.context=[4096]" "grid.shard_of_tp=[8]"
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r3.tgz r3 && rm -rf r3 && ls -la $OUT
