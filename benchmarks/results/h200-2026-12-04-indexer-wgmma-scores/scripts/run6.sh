#!/usr/bin/env bash
# Gluon indexer score kernel (FP8 keys): tests, sweep, step base vs new at 32K.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r6; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/indexer*.py bench_tmp/base/tp_runtime/ops/indexer*.py; } > $R/env.txt 2>&1
timeout -k 10 -s INT 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_indexer_scores_wgmma_gpu.py \
  tests/test_fp8_cache_gpu.py tests/test_pdl_gpu.py tests/test_kernels_gpu.py -k "topk or scores or indexer" \
  > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt; tail -15 $R/tests.log
timeout -k 10 -s INT 170 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 128 256 \
  --contexts 4096 32768 --variants default "triton scores" "ahead 1" "runs x2" > $R/sweep.log 2>&1
echo "sweep rc=$? $(el) s" >> $R/env.txt; grep "keys fp8" $R/sweep.log
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 110 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^$"
}
[ $(el) -lt 370 ] && bench $ROOT new_1 "grid.bench.batch=[1, 128]" "grid.bench.context=[32768]"
[ $(el) -lt 470 ] && bench $ROOT/bench_tmp/base base_1 "grid.bench.batch=[1, 128]" "grid.bench.context=[32768]"
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r6.tgz r6 && rm -rf r6 && ls -la $OUT
