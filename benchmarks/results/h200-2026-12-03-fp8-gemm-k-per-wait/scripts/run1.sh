#!/usr/bin/env bash
# FP8 GEMM diagnostics: baseline times, Nsight Compute on the M = 128 launches, the two-MMA-warpgroup kernel.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/diag; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; md5sum tp_runtime/ops/fp8_gemm_wgmma.py tp_runtime/ops/fp8_gemm_table.json bench_tmp/fp8_gemm_wgmma_2wg.py; which ncu; } > $R/env.txt 2>&1
# the two-warpgroup tree, smoked in the background while the main tree is timed
rm -rf /tmp/exp && mkdir /tmp/exp && cp -r tp_runtime benchmarks bench_tmp pyproject.toml /tmp/exp/ && cp bench_tmp/fp8_gemm_wgmma_2wg.py /tmp/exp/tp_runtime/ops/fp8_gemm_wgmma.py
( cd /tmp/exp; for t in "64 128 8 4" "128 128 8 4" "32 256 8 4" "64 256 8 4" "64 64 4 6"; do
    (PYTHONPATH=/tmp/exp timeout 120 python3 bench_tmp/smoke_ws.py $t > "$R/smoke2wg_${t// /_}.log" 2>&1; echo "rc=$?" >> "$R/smoke2wg_${t// /_}.log") &
  done; wait ) &
SMOKE=$!
timeout 100 python3 bench_tmp/diag.py time > $R/time_main.log 2>&1; echo "time rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
wait $SMOKE; echo "smoke done $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 150 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Chart --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section SchedulerStats \
  -o $R/ncu python3 bench_tmp/diag.py ncu > $R/ncu_run.log 2>&1; echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
ncu --import $R/ncu.ncu-rep --page details --csv > $R/ncu_details.csv 2>&1
ncu --import $R/ncu.ncu-rep --page raw --csv 2>&1 | gzip > $R/ncu_raw.csv.gz
timeout 120 python3 bench_tmp/diag.py ws8 > $R/ws8_main.log 2>&1; echo "ws8 main rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
if ! grep -q "rc=[1-9]" $R/smoke2wg_*.log; then
  (cd /tmp/exp && PYTHONPATH=/tmp/exp timeout 120 python3 bench_tmp/diag.py ws8 > $R/ws8_2wg.log 2>&1); echo "ws8 2wg rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
fi
cd $OUT && tar czf diag.tgz diag && rm -rf diag
