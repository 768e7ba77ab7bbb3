#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/ncu; mkdir -p $R; T0=$(date +%s)
git stash list >/dev/null 2>&1
cp bench_tmp/diag/v_base.py tp_runtime/ops/sparse_attention_ws_wgmma.py   # main's kernel
which ncu > $R/env.txt; ncu --version >> $R/env.txt 2>&1
timeout 200 ncu --clock-control none -k regex:_ws_kernel --launch-skip 2 --launch-count 1 --import-source yes \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section SourceCounters --section Occupancy --section LaunchStats \
  -o $R/ws python3 bench_tmp/diag/ncu_ws.py 128/4096/4/64 > $R/ncu_run.log 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
ncu --import $R/ws.ncu-rep --page details --csv > $R/details.csv 2>&1
ncu --import $R/ws.ncu-rep --page source --csv --print-source sass > $R/source_sass.csv 2> $R/source_err.txt
echo "source rc=$?" >> $R/env.txt
ncu --import $R/ws.ncu-rep --page raw --csv 2>&1 | gzip > $R/raw.csv.gz
ls -la $R >> $R/env.txt; cat $R/env.txt; tail -5 $R/ncu_run.log; head -c 600 $R/source_err.txt
grep -i "stall\|warp cycles\|issued\|Throughput\|Duration" $R/details.csv | head -60
gzip $R/source_sass.csv $R/details.csv; rm -f $R/ws.ncu-rep
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu && ls -la $OUT
