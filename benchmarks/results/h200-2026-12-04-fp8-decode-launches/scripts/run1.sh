#!/usr/bin/env bash
# gemv_tma: GPU tests, a tune of M = 1 for Flash tp 1 and 8, then the step at batch 1 (tp 1, rank 0 of tp 8):
# base (main before) against this tree with the new M = 1 table, interleaved.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -x \
  "tests/test_fp8_gemm_gpu.py::test_gemv_tma_rounds_x_as_the_twin_and_sums_exact_products" \
  "tests/test_fp8_gemm_gpu.py::test_split_k_deterministic_and_in_a_cuda_graph" \
  "tests/test_fp8_gemm_gpu.py::test_every_launch_kind" "tests/test_fp8_gemm_gpu.py::test_gemv_tma_at_every_shape" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" | tee -a $R/env.txt; tail -25 $R/tests.log
PYTHONPATH=$PWD timeout 260 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 1 --budget-s 170 --jobs 16 \
  --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(el) s" | tee -a $R/env.txt; grep -E "M=   1|compiled|budget" $R/tune.log
rm -rf bench_tmp/c; mkdir -p bench_tmp/c; cp -r tp_runtime configs pyproject.toml bench_tmp/c/
[ -f $R/tune/fp8_gemm_table.json ] && cp $R/tune/fp8_gemm_table.json bench_tmp/c/tp_runtime/ops/fp8_gemm_table.json
bench() {  # bench NAME TREE
  local left=$(( 585 - $(el) )); [ $left -lt 60 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench $OLDPWD/configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep -E "full@fp8|full " $R/$1.log | head -4
}
for r in 1 2; do bench base_$r bench_tmp/base; bench tma_$r bench_tmp/c; done
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
