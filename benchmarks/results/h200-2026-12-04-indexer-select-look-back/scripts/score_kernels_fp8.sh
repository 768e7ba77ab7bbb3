#!/usr/bin/env bash
# measurement only: the Triton score kernel against the wgmma one over FP8 keys, batch 1-128, 4K and 32K
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T00=$(date +%s)
S=$OUT/score_kernels_fp8; mkdir -p $S
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py tp_runtime/ops/indexer_scores_wgmma.py > $S/env.txt
timeout 280 python3 -m benchmarks.indexer_sweep $S/sweep --rounds 3 --batches 1 8 16 32 64 128 --contexts 4096 32768 \
  --variants default "triton scores" > $S/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - T00 )) s" >> $S/env.txt
cat $S/env.txt; cat $S/sweep/table.md 2>/dev/null || tail -5 $S/sweep.log
cd $OUT && tar czf score_kernels_fp8.tgz score_kernels_fp8
