#!/usr/bin/env bash
# The split select's sort sizes and register cap: tests, the sweep of variants, the decode step (main's tree,
# then this one).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/s3; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/base/tp_runtime/ops/indexer_topk.py bench_tmp/base/tp_runtime/ops/topk_select.py; } > $R/env.txt 2>&1
timeout 130 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_kernels_gpu.py \
  -k "sorts_every or long_context or exact_ties or float_inputs" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt
tail -2 $R/tests.log
timeout 170 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 8 32 128 256 --contexts 4096 32768 \
  --variants default "sort 512" "regs 64" "regs 80" "regs any" > $R/sweep.log 2>&1
echo "sweep rc=$? $(el) s" >> $R/env.txt
cat $R/sweep/table.md
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 100 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
for i in 1 2; do
  [ $(el) -lt 330 ] && bench $ROOT/bench_tmp/base base_$i "grid.bench.batch=[1, 128]" "grid.bench.context=[4096, 32768]"
  [ $(el) -lt 370 ] && bench $ROOT new_$i "grid.bench.batch=[1, 128]" "grid.bench.context=[4096, 32768]"
done
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf s3.tgz s3 && rm -rf s3 && ls -la $OUT
