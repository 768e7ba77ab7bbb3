#!/usr/bin/env bash
# The whole GPU suite on the final tree, then the FP8 step bench (batch 1 to 256, tp 1 and rank 0 of tp 8).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; md5sum tp_runtime/ops/*.py tp_runtime/ops/fp8_gemm_table.json; } > $R/env.txt 2>&1
ONLY_PYTEST=1 PYTEST_WORKERS=16 timeout 430 bash benchmarks/gpu_checks.sh $R/gpu_suite > /dev/null 2>&1
echo "suite rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt; tail -4 $R/gpu_suite/pytest_gpu.log
LEFT=$(( 570 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && timeout $LEFT python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml bench.output=$R/bench > $R/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
rm -rf $R/bench/fp8_gemm/traces
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
