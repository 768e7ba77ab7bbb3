#!/usr/bin/env bash
# GEMV with the weight a step ahead (first tile before the PDL wait): GPU tests of the M = 1 launches, a tune of
# M = 1 for Flash tp 1 and 8 (new GEMV tiles, the Gluon kernels), then the step at batch 1 and 8: the base tree (its
# table) against this tree (the new table), each lane pair interleaved by the bench.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; md5sum tp_runtime/ops/*.py tp_runtime/ops/fp8_gemm_table.json bench_tmp/base/tp_runtime/ops/linear.py; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 170 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_fp8_gemm_gpu.py tests/test_linear_gpu.py tests/test_pdl_gpu.py > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" | tee -a $R/env.txt; tail -3 $R/tests.log
PYTHONPATH=$PWD timeout 230 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 1 --budget-s 110 --jobs 16 \
  --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(el) s" | tee -a $R/env.txt; tail -14 $R/tune.log
[ -f $R/tune/fp8_gemm_table.json ] && cp $R/tune/fp8_gemm_table.json tp_runtime/ops/fp8_gemm_table.json
bench() {  # bench NAME TREE BATCHES
  local left=$(( 575 - $(el) )); [ $left -lt 60 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=$3" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  tail -16 $R/$1.log
}
bench base_a bench_tmp/base "[1, 8]"
bench new_a . "[1, 8]"
bench base_b bench_tmp/base "[1]"
bench new_b . "[1]"
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
