#!/usr/bin/env bash
# GPU tests of the selects (PDL too), the indexer sweep against main's files, then the decode step at 32K:
# this tree, then main's (bench_tmp/base), one machine
set -u
export PYTHONUNBUFFERED=1
T00=$(date +%s); ROOT=$PWD; el() { echo $(( $(date +%s) - T00 )); }
R=$OUT/lb2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py bench_tmp/base/tp_runtime/ops/indexer_topk.py \
  bench_tmp/base/tp_runtime/ops/topk_select.py >> $R/env.txt
PYTHONPATH=$ROOT timeout 130 python3 -m pytest -m gpu -q -n 8 tests/test_kernels_gpu.py tests/test_pdl_gpu.py \
  -k "long_context or split_select or exact_ties or float_inputs or replays or prefill_chunk or topk_config or test_indexer_topk" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt
PYTHONPATH=$ROOT timeout 100 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 2 8 16 128 --contexts 32768 \
  --baseline bench_tmp/base/tp_runtime/ops/indexer_topk.py --variants default > $R/sweep.log 2>&1
echo "sweep rc=$? $(el) s" >> $R/env.txt
S=$R/step; mkdir -p $S
bench() {  # TREE NAME
  local tree=$1 name=$2 lim=$(( 575 - $(el) )); [ $lim -gt 200 ] && lim=200
  (cd $tree && PYTHONPATH=$tree timeout $lim python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "grid.bench.batch=[1, 8, 128]" "grid.bench.context=[32768]" bench.output=$S/$name > $S/$name.log 2>&1)
  echo "step $name rc=$? $(el) s" >> $R/env.txt
}
bench $ROOT new
bench $ROOT/bench_tmp/base base
find $S -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
grep -v "\.py$" $R/env.txt; tail -2 $R/tests.log; cat $R/sweep/table.md 2>/dev/null || tail -5 $R/sweep.log
for f in $S/*/*/profile_view.txt; do echo $f | cut -d/ -f5-; grep "^full" $f | cut -c1-140; done
for f in $S/*/*/points.jsonl; do python3 -c "
import json
for l in open('$f'):
    p=json.loads(l)
    if p.get('kind')=='point': print('$f'.split('/')[-3], p['batch'], p['context'], p['cache_format'], round(p['step_ms_median'],3))"; done
cd $OUT && tar czf lb2.tgz lb2 && rm -rf lb2
