#!/usr/bin/env bash
# the split select's first digit and warps at small batches, 32K
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py >> $OUT/env.txt
timeout 400 python3 -m benchmarks.indexer_sweep $OUT/sweep --rounds 3 --batches 1 2 4 8 16 --contexts 32768 \
  --variants default "hi 11" "hi 10" "select w4" "select w4 regs any" > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
cd $OUT && tar czf all.tgz env.txt sweep.log sweep 2>/dev/null; cd - >/dev/null
grep -v "\.py$" $OUT/env.txt; cat $OUT/sweep/table.md 2>/dev/null || tail -20 $OUT/sweep.log
