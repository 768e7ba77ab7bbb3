#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/*.py >> $R/env.txt
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 150 ncu --clock-control none -k regex:codes_score_kernel --launch-skip 2 --launch-count 1 --import-source yes $SECS -o $R/scores python3 bench_tmp/c1/ncu_scores.py > $R/scores.log 2>&1
echo "scores ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
ncu --import $R/scores.ncu-rep --page details --csv > $R/scores.details.csv 2>&1
ncu --import $R/scores.ncu-rep --page source --csv --print-source sass > $R/scores.sass.csv 2>/dev/null
gzip $R/scores.details.csv $R/scores.sass.csv; rm -f $R/scores.ncu-rep
timeout 170 python3 -m benchmarks.attention_sweep $R/attn --batches 1 8 --jobs 14 \
  --variant 16,64,1,8,2 --variant 16,32,1,8,2 --variant 16,32,1,8,1 --variant 16,64,1,8,1 --variant 16,32,1,4,2 \
  --variant 16,32,1,4,1 --variant 32,32,1,8,2 --variant 64,32,1,8,2 --variant 64,16,1,8,2 --variant 16,16,1,4,2 > $R/attn.log 2>&1
echo "attn rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 150 python3 -m benchmarks.indexer_sweep $R/idx --rounds 3 --batches 128 256 --contexts 4096 32768 \
  --variants default "runs x2" "runs x4" "runs x8" > $R/idx.log 2>&1
echo "idx rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
cat $R/env.txt | grep -v "\.py$"; cat $R/idx/table.md; cat $R/attn/table.md; grep -i "error\|Trace" $R/attn.log | head
cd $OUT && tar czf r.tgz r && rm -rf r
