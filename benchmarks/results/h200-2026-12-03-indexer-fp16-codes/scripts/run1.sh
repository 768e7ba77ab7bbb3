#!/usr/bin/env bash
# Indexer score kernel: tests of its launches, the sweep of pipeline depths and tiles, Nsight Compute on it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/s1; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head; md5sum tp_runtime/ops/indexer_topk.py; which ncu; } > $R/env.txt 2>&1
timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py tests/test_fp8_cache_gpu.py -k "topk or scores" > $R/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 240 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 2 --batches 1 8 32 128 256 --contexts 4096 32768 \
  --variants default s3 s4 "s3 runs x2" "n128 w8 s3" "n128 w8 s4" > $R/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 120 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
  -o $R/ncu python3 bench_tmp/s1/idx_diag.py > $R/ncu_run.log 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
ncu --import $R/ncu.ncu-rep --page details --csv > $R/ncu_details.csv 2>&1
rm -f $R/ncu.ncu-rep
cd $OUT && tar czf s1.tgz s1 && rm -rf s1
