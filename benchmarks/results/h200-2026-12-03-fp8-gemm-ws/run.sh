#!/usr/bin/env bash
# Warp-specialized FP8 GEMM with two MMA warpgroups: smoke (falls back to the one-warpgroup kernel on a fault),
# the Flash retune (tp 1 and 8, M >= 8), the new table into the tree, then the whole GPU suite. One archive out.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/fp8_gemm_wgmma.py tp_runtime/ops/fp8_gemm.py; } > $R/env.txt 2>&1
smoke() {  # smoke LOG: every tile kind in its own process; fails if one faulted
  for t in "16 128 4 8" "32 64 4 8" "64 64 4 6" "128 64 4 4" "64 128 8 4" "128 128 8 4" "32 256 8 4" "64 256 8 4"; do
    (timeout 90 python3 bench_tmp/smoke_ws.py $t > "$R/smoke_${t// /_}.log" 2>&1; echo "rc=$?" >> "$R/smoke_${t// /_}.log") &
  done; wait
  for f in $R/smoke_*.log; do echo "$f: $(grep -c ': err' $f) runs, $(tail -1 $f), worst $(grep -o 'err [0-9.e+-]*' $f | sort -k2 -g | tail -1)"; done | tee $1
  for f in $R/smoke_*.log; do grep -m2 "Error:\|error:" $f; done >> $1
  ! grep -q "rc=[1-9]" $1
}
echo two_warpgroups > $R/variant.txt
if ! smoke $R/smoke.log; then
  echo "SMOKE FAILED; the one-warpgroup kernel instead"; cat $R/smoke.log
  cp bench_tmp/fp8_gemm_wgmma_alt.py tp_runtime/ops/fp8_gemm_wgmma.py; echo one_warpgroup > $R/variant.txt
  mkdir -p $R/failed_smoke; mv $R/smoke_*.log $R/failed_smoke/
  smoke $R/smoke_alt.log || { echo "ALT FAILED TOO"; cat $R/smoke_alt.log; cd $OUT && tar czf run.tgz run && rm -rf run; exit 1; }
fi
echo "smoke done $(( $(date +%s) - T0 )) s"
timeout 170 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 8 16 32 64 128 256 512 \
  --budget-s 150 --jobs 16 --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/tune.log; tail -2 $R/tune.log
gzip -f $R/tune/fp8_gemm_tune.jsonl 2>/dev/null
if grep -q "0 winners off their twin" $R/tune.log; then cp $R/tune/fp8_gemm_table.json tp_runtime/ops/fp8_gemm_table.json; fi
md5sum tp_runtime/ops/fp8_gemm_table.json tp_runtime/ops/fp8_gemm_wgmma.py >> $R/env.txt
ONLY_PYTEST=1 PYTEST_WORKERS=16 timeout $(( 585 - ($(date +%s) - T0) )) bash benchmarks/gpu_checks.sh $R/gpu_suite > /dev/null 2>&1
echo "suite rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt; tail -3 $R/gpu_suite/pytest_gpu.log
cd $OUT && tar czf run.tgz run && rm -rf run
