#!/usr/bin/env bash
# Rank 0's shard of tp 8 at batch 1 / 4K, bf16 and FP8 (+ e4m3 activations) weights interleaved: this tree, main's
# before (bench_tmp/base), this tree again, while time allows.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/shard8; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  md5sum tp_runtime/ops/sparse_attention.py bench_tmp/base/tp_runtime/ops/sparse_attention.py; } > $R/env.txt 2>&1
bench() {  # NAME TREE
  local left=$(( 380 - $(el) )); [ $left -lt 50 ] && { echo "skip $1" >> $R/env.txt; return; }
  (cd $2 && PYTHONPATH=$2 timeout $left python3 -m tp_runtime.cli bench $ROOT/configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1]" "grid.shard_of_tp=[8]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" >> $R/env.txt; rm -rf $R/$1/*/traces
}
bench new_1 $ROOT; bench base_1 $ROOT/bench_tmp/base; bench new_2 $ROOT; bench base_2 $ROOT/bench_tmp/base
cat $R/env.txt
for f in $R/*/*/points.jsonl; do python3 -c "
import json
for l in open('$f'):
    p=json.loads(l); print('$f'.split('/')[-3], p.get('mode'), p['batch'], p.get('weight_format'), round(p['step_ms_median'],3), round(p['profile_view_ms']['attention'],3))"; done
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
cd $OUT && tar czf shard8.tgz shard8 && rm -rf shard8
