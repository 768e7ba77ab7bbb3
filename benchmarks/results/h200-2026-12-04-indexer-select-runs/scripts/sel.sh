#!/usr/bin/env bash
# tests of the selects, then the indexer sweep against main's files (bench_tmp/base), one machine
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $OUT/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/base/tp_runtime/ops/indexer_topk.py \
  bench_tmp/base/tp_runtime/ops/topk_select.py >> $OUT/env.txt
timeout 200 python3 -m pytest -m gpu -q -n 8 tests/test_kernels_gpu.py tests/test_fp8_cache_gpu.py tests/test_pdl_gpu.py \
  -k "topk or split_select or indexer" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
timeout 330 python3 -m benchmarks.indexer_sweep $OUT/sweep --rounds 3 --batches 1 2 4 8 16 32 128 256 --contexts 32768 \
  --baseline bench_tmp/base/tp_runtime/ops/indexer_topk.py \
  --variants default "split c512" "split c1024" "split c2048" "regs 96" > $OUT/sweep.log 2>&1
echo "sweep32k rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
timeout 60 python3 -m benchmarks.indexer_sweep $OUT/sweep4k --rounds 3 --batches 1 128 --contexts 4096 \
  --baseline bench_tmp/base/tp_runtime/ops/indexer_topk.py --variants default > $OUT/sweep4k.log 2>&1
echo "sweep4k rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
cd $OUT && tar czf all.tgz env.txt tests.log sweep.log sweep4k.log sweep sweep4k 2>/dev/null; cd - >/dev/null
grep -v "\.py$" $OUT/env.txt; tail -3 $OUT/tests.log; cat $OUT/sweep/table.md 2>/dev/null || tail -20 $OUT/sweep.log
cat $OUT/sweep4k/table.md 2>/dev/null || tail -5 $OUT/sweep4k.log
