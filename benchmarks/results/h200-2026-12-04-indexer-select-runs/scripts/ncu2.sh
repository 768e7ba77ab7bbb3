#!/usr/bin/env bash
# Nsight Compute (measurement only, main's kernels): the split select at batch 1 and 128 / 32K; the 8-head
# heads-on-N attention and the warp-specialized one at ratio 128, batch 128 / 4K, FP8 rows
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/ncu; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
md5sum tp_runtime/ops/*.py >> $R/env.txt
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
prof() {  # name regex skip count cmd...
  local n=$1 k=$2 sk=$3 c=$4; shift 4
  timeout 120 ncu --clock-control none -k regex:"$k" --launch-skip $sk --launch-count $c --import-source yes $SECS -o $R/$n "$@" > $R/$n.log 2>&1
  echo "$n ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
  ncu --import $R/$n.ncu-rep --page details --csv > $R/$n.details.csv 2>&1
  ncu --import $R/$n.ncu-rep --page source --csv --print-source sass > $R/$n.sass.csv 2>/dev/null
  gzip $R/$n.details.csv $R/$n.sass.csv; rm -f $R/$n.ncu-rep
}
prof select_b1 split_select_kernel 2 1 python3 bench_tmp/c1/ncu_sel.py 1
prof select_b128 split_select_kernel 2 1 python3 bench_tmp/c1/ncu_sel.py 128
prof attn8_b128 "_attn_kernel" 2 1 python3 bench_tmp/c1/ncu_attn.py 128/4096/4/8/1
prof ws_r128_b128 "_ws_kernel" 2 1 python3 bench_tmp/c1/ncu_attn.py 128/4096/128/64/1
grep -v "\.py$" $R/env.txt
for n in select_b1 select_b128 attn8_b128 ws_r128_b128; do
  zcat $R/$n.details.csv.gz 2>/dev/null | grep -E '"Duration"|"DRAM Throughput"|"Registers Per Thread"|"Achieved Occupancy"|"Issued Warp Per Scheduler"' | cut -c1-220 | sed "s/^/$n /" | head -6
done
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu
