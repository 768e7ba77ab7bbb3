#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $OUT/env.txt
md5sum tp_runtime/ops/*.py >> $OUT/env.txt
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
prof() {  # name regex skip count cmd...
  local n=$1 k=$2 sk=$3 c=$4; shift 4
  timeout 150 ncu --clock-control none -k regex:"$k" --launch-skip $sk --launch-count $c --import-source yes $SECS -o $OUT/$n "$@" > $OUT/$n.log 2>&1
  echo "$n ncu rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
  ncu --import $OUT/$n.ncu-rep --page details --csv > $OUT/$n.details.csv 2>&1
  ncu --import $OUT/$n.ncu-rep --page source --csv --print-source sass > $OUT/$n.sass.csv 2>/dev/null
  gzip $OUT/$n.details.csv $OUT/$n.sass.csv; rm -f $OUT/$n.ncu-rep
}
prof scores codes_score_kernel 2 1 python3 bench_tmp/c1/ncu_scores.py
prof attn_b1_fp8 "_sparse_attn_kernel|_combine_kernel" 2 2 python3 bench_tmp/c1/ncu_attn.py 1/4096/4/64/1
prof attn_b1_bf16 "_sparse_attn_kernel|_combine_kernel" 2 2 python3 bench_tmp/c1/ncu_attn.py 1/4096/4/64/0
timeout 200 python3 -m benchmarks.indexer_sweep $OUT/idx --rounds 3 --batches 128 256 --contexts 32768 \
  --variants default "runs x2" "runs x4" s3 "s3 runs x2" > $OUT/idx.log 2>&1
echo "idx rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
timeout 200 python3 -m benchmarks.attention_sweep $OUT/attn --cache fp8 --batches 1 --jobs 12 \
  --variant 64,32,1,8,2 --variant 64,64,1,8,2 --variant 32,64,1,8,2 --variant 16,64,1,8,2 --variant 16,32,1,8,2 \
  --variant 16,64,1,4,2 --variant 16,32,1,4,3 --variant 32,32,1,8,2 > $OUT/attn.log 2>&1
echo "attn rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
cat $OUT/env.txt | grep -v "\.py$"; tail -3 $OUT/idx.log; cat $OUT/attn/table.md 2>/dev/null; tail -5 $OUT/attn.log
