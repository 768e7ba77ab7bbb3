#!/usr/bin/env bash
# GPU tests of the selects, then the indexer sweep: this tree (look-back; sort / digits finishes) against main's files
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/sel; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/base/tp_runtime/ops/indexer_topk.py \
  bench_tmp/base/tp_runtime/ops/topk_select.py >> $R/env.txt
timeout 150 python3 -m pytest -m gpu -q -n 8 tests/test_kernels_gpu.py \
  -k "long_context or split_select or exact_ties or float_inputs or replays or prefill_chunk or topk_config" > $R/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 300 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 2 4 8 16 32 128 256 --contexts 32768 \
  --baseline bench_tmp/base/tp_runtime/ops/indexer_topk.py --variants default digits "digits 512" > $R/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
grep -v "\.py$" $R/env.txt; tail -3 $R/tests.log; cat $R/sweep/table.md 2>/dev/null || tail -20 $R/sweep.log
cd $OUT && tar czf sel.tgz sel && rm -rf sel
