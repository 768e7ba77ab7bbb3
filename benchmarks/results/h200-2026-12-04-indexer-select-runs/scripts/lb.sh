#!/usr/bin/env bash
# measurement only (not landed): the look-back split select against main's (bench_tmp/landed), GPU tests of it
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/lb; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/landed/*.py >> $R/env.txt
timeout 100 python3 -m pytest -m gpu -q -n 8 tests/test_kernels_gpu.py \
  -k "long_context or split_select or exact_ties or float_inputs or replays or prefill_chunk" > $R/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 170 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 2 8 16 32 128 --contexts 32768 \
  --baseline bench_tmp/landed/indexer_topk.py --variants default > $R/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
grep -v "\.py$" $R/env.txt; tail -3 $R/tests.log; cat $R/sweep/table.md 2>/dev/null || tail -20 $R/sweep.log
cd $OUT && tar czf lb.tgz lb && rm -rf lb
