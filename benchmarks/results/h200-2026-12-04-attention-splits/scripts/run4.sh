#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
T00=$(date +%s); ROOT=$PWD; el() { echo $(( $(date +%s) - T00 )); }
R=$OUT/r4; mkdir -p $R
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/sparse_attention.py bench_tmp/base_sa.py bench_tmp/base/tp_runtime/ops/sparse_attention.py >> $R/env.txt
timeout 110 python3 -m benchmarks.attention_sweep $R/sweep64 --batches 2 4 32 --jobs 14 --baseline bench_tmp/base_sa.py \
  --variant 16,32,1,8,1 > $R/sweep64.log 2>&1
echo "sweep64 rc=$? $(el) s" >> $R/env.txt
timeout 90 python3 -m benchmarks.attention_sweep $R/sweep8 --batches 8 16 32 --heads 8 --jobs 14 --baseline bench_tmp/base_sa.py \
  --variant 16,32,1,8,1 > $R/sweep8.log 2>&1
echo "sweep8 rc=$? $(el) s" >> $R/env.txt
S=$R/step; mkdir -p $S
bench() {  # TREE NAME: 43 Flash layers, full graph, bf16 / FP8 caches, batch 1, 8, 32 at 4K
  local tree=$1 name=$2 lim=$(( 580 - $(el) )); [ $lim -gt 185 ] && lim=185
  (cd $tree && PYTHONPATH=$tree timeout $lim python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "grid.bench.batch=[1, 8, 32]" "grid.bench.context=[4096]" bench.output=$S/$name > $S/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
}
bench $ROOT new
bench $ROOT/bench_tmp/base base
find $S -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
cat $R/env.txt | grep -v "\.py$"; cat $R/sweep64/table.md $R/sweep8/table.md; cat $S/*/*/profile_view.txt | grep -v "^---\|^lane\|^$"
for f in $S/*/*/points.jsonl; do python3 -c "
import json,sys
for l in open('$f'):
    p=json.loads(l); print('$f'.split('/')[-3], p['batch'], p['context'], p['cache_format'], round(p['step_ms_median'],3))"; done
cd $OUT && tar czf r4.tgz r4 && rm -rf r4
