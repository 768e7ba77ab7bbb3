#!/usr/bin/env bash
# K steps a wait in the warp-specialized FP8 GEMM: retune Flash tp 1 / 8, then the step bench. Small archives out.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; md5sum tp_runtime/ops/fp8_gemm_wgmma.py tp_runtime/ops/fp8_gemm.py tp_runtime/ops/fp8_gemm_table.json benchmarks/fp8_gemm_tune.py; } > $R/env.txt 2>&1
timeout 230 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 8 16 32 64 128 256 512 \
  --budget-s 190 --jobs 16 --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
gzip -f $R/tune/fp8_gemm_tune.jsonl 2>/dev/null
if grep -q "0 winners off their twin" $R/tune.log; then cp $R/tune/fp8_gemm_table.json tp_runtime/ops/fp8_gemm_table.json; echo "table taken" >> $R/env.txt; fi
md5sum tp_runtime/ops/fp8_gemm_table.json >> $R/env.txt
(cd $OUT && tar czf tune.tgz run/tune run/tune.log run/env.txt)
LEFT=$(( 560 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml bench.output=$R/bench > $R/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
find $R/bench -type f -exec ls -la {} \; > $R/bench_files.txt
cd $OUT && tar czf bench.tgz $(cd $OUT && find run/bench -type f -size -6M) run/bench.log run/env.txt run/bench_files.txt && rm -rf run; ls -la $OUT
