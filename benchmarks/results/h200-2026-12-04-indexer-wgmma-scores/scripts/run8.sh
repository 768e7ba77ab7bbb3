#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/ncu; mkdir -p $R; T0=$(date +%s)
timeout 240 ncu --clock-control none -k regex:score_kernel --launch-skip 2 --launch-count 4 --import-source yes \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section SourceCounters --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  -o $R/sc python3 bench_tmp/idx/ncu_scores.py > $R/ncu_run.log 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
ncu --import $R/sc.ncu-rep --page details --csv > $R/details.csv 2>&1
ncu --import $R/sc.ncu-rep --page source --csv --print-source sass > $R/source_sass.csv 2> $R/source_err.txt
tail -5 $R/ncu_run.log; cat $R/env.txt
grep -i "Duration\|DRAM Through\|Issued Warp\|Registers Per\|Achieved Occ\|Warp Cycles Per Issued\|Pipe\|pipe" $R/details.csv | cut -c1-300 | head -60
gzip $R/source_sass.csv $R/details.csv; rm -f $R/sc.ncu-rep
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu && ls -la $OUT
