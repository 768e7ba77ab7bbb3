#!/usr/bin/env bash
# K steps a wait in the warp-specialized FP8 GEMM: smoke each tile kind, retune Flash tp 1 / 8, then the step bench.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; md5sum tp_runtime/ops/fp8_gemm_wgmma.py tp_runtime/ops/fp8_gemm.py tp_runtime/ops/fp8_gemm_table.json benchmarks/fp8_gemm_tune.py; } > $R/env.txt 2>&1
for t in "16 128 4 8 4" "64 64 4 6 2" "64 64 4 8 4" "128 64 4 4 2" "64 128 4 6 2" "128 128 8 4 1" "32 256 8 4 2" "64 64 4 6 1"; do
  (timeout 100 python3 bench_tmp/smoke_ws.py $t > "$R/smoke_${t// /_}.log" 2>&1; echo "rc=$?" >> "$R/smoke_${t// /_}.log") &
done; wait
for f in $R/smoke_*.log; do echo "$f: $(tail -1 $f) worst $(grep -o 'err [0-9.e+-]*' $f | sort -k2 -g | tail -1) n=$(grep -c 'err' $f)"; done | tee $R/smoke.txt
echo "smoke done $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
if grep -q "rc=[1-9]" $R/smoke.txt; then
  echo "SMOKE FAILED: tuning with one K step a wait only" | tee -a $R/env.txt
  sed -i 's/for k in (1, 2, 4) if/for k in (1,) if/' benchmarks/fp8_gemm_tune.py
fi
timeout 230 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 8 16 32 64 128 256 512 \
  --budget-s 190 --jobs 16 --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt; tail -3 $R/tune.log
gzip -f $R/tune/fp8_gemm_tune.jsonl 2>/dev/null
if grep -q "0 winners off their twin" $R/tune.log; then cp $R/tune/fp8_gemm_table.json tp_runtime/ops/fp8_gemm_table.json; echo "table taken" >> $R/env.txt; fi
md5sum tp_runtime/ops/fp8_gemm_table.json >> $R/env.txt
LEFT=$(( 570 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml bench.output=$R/bench > $R/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
cd $OUT && tar czf run.tgz run && rm -rf run
