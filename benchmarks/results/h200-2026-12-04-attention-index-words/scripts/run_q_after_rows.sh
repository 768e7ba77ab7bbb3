#!/usr/bin/env bash
# q loaded once the loader's first row loads are out: WS tests, kernel A/B (main / low words / + q after rows), step.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; md5sum tp_runtime/ops/sparse_attention*.py bench_tmp/diag/v_*.py; } > $R/env.txt 2>&1
timeout -k 10 -s INT 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_attention_wgmma_gpu.py \
  -k "ws or attn_config" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt; tail -2 $R/tests.log
timeout -k 10 200 python3 bench_tmp/diag/diag.py base,lw,go,tlgo \
  128/4096/4/64,128/4096/128/64,256/4096/4/64,256/4096/128/64,128/32768/4/64 > $R/diag.log 2>&1
echo "diag rc=$? $(el) s" >> $R/env.txt; cat $R/diag.log
bench() {
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 110 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
[ $(el) -lt 300 ] && bench $ROOT new_2 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
[ $(el) -lt 360 ] && bench $ROOT/bench_tmp/base base_2 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r4.tgz r4 && rm -rf r4 && ls -la $OUT
