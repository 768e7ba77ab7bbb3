#!/usr/bin/env bash
# GEMV with its first weight tile loaded before the PDL wait (the rest as before): GPU tests of the launches, a tune of
# M = 1 for Flash tp 1 and 8, then the step at batch 1, tp 1 and rank 0 of tp 8, three trees interleaved twice:
# base (main before), peel (this tree, the committed table), peel_tuned (this tree, the new M = 1 table).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; md5sum tp_runtime/ops/linear.py tp_runtime/ops/fp8_gemm_table.json bench_tmp/base/tp_runtime/ops/linear.py; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_linear_gpu.py tests/test_pdl_gpu.py \
  "tests/test_fp8_gemm_gpu.py::test_every_launch_kind" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" | tee -a $R/env.txt; tail -3 $R/tests.log
PYTHONPATH=$PWD timeout 200 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 1 --budget-s 110 --jobs 16 \
  --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(el) s" | tee -a $R/env.txt; grep "M=   1" $R/tune.log
rm -rf bench_tmp/c; mkdir -p bench_tmp/c; cp -r tp_runtime configs pyproject.toml bench_tmp/c/
[ -f $R/tune/fp8_gemm_table.json ] && cp $R/tune/fp8_gemm_table.json bench_tmp/c/tp_runtime/ops/fp8_gemm_table.json
bench() {  # bench NAME TREE
  local left=$(( 580 - $(el) )); [ $left -lt 50 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep "full@fp8" $R/$1.log | head -2
}
for r in 1 2; do bench base_$r bench_tmp/base; bench peel_$r .; bench peel_tuned_$r bench_tmp/c; done
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
