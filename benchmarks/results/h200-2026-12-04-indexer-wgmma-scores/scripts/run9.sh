#!/usr/bin/env bash
# Gluon indexer score kernel with a cp.async ring: tests, sweep, step new at 32K (base in r6).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r9; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; md5sum tp_runtime/ops/indexer*.py; } > $R/env.txt 2>&1
timeout -k 10 -s INT 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider -rfE tests/test_indexer_scores_wgmma_gpu.py \
  tests/test_fp8_cache_gpu.py tests/test_pdl_gpu.py -k "topk or scores or indexer" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt; tail -6 $R/tests.log
timeout -k 10 -s INT 200 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 3 --batches 1 128 256 \
  --contexts 4096 32768 --variants default "triton scores" s2 s4 > $R/sweep.log 2>&1
echo "sweep rc=$? $(el) s" >> $R/env.txt; grep "keys fp8" $R/sweep.log; tail -3 $R/sweep.log
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 200 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^$\|^lane"
  grep -h step_ms_median $R/$name/*/points.jsonl 2>/dev/null | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); print({k: d[k] for k in d if k in ('lane', 'batch', 'context', 'step_ms_median')})" 2>/dev/null
}

find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r9.tgz r9 && rm -rf r9 && ls -la $OUT
