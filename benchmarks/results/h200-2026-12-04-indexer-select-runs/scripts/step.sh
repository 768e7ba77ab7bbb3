#!/usr/bin/env bash
# the decode step at 32K, batch 1, 8, 128, bf16 and FP8 caches: this tree, then main's (bench_tmp/base), one machine
set -u
export PYTHONUNBUFFERED=1
T00=$(date +%s); ROOT=$PWD; el() { echo $(( $(date +%s) - T00 )); }
R=$OUT/step; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/base/tp_runtime/ops/indexer_topk.py \
  bench_tmp/base/tp_runtime/ops/topk_select.py >> $R/env.txt
bench() {  # TREE NAME
  local tree=$1 name=$2 lim=$(( 570 - $(el) )); [ $lim -gt 250 ] && lim=250
  (cd $tree && PYTHONPATH=$tree timeout $lim python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "grid.bench.batch=[1, 8, 128]" "grid.bench.context=[32768]" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
}
bench $ROOT new
bench $ROOT/bench_tmp/base base
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
grep -v "\.py$" $R/env.txt; cat $R/*/*/profile_view.txt | grep -v "^---\|^lane\|^$"
for f in $R/*/*/points.jsonl; do python3 -c "
import json,sys
for l in open('$f'):
    p=json.loads(l)
    if p.get('kind')=='point': print('$f'.split('/')[-3], p['batch'], p['context'], p['cache_format'], round(p['step_ms_median'],3))"; done
cd $OUT && tar czf step.tgz step && rm -rf step
