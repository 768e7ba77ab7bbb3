#!/usr/bin/env bash
# The pair launch (wq_b + the indexer's wq_b of qr in one launch): its GPU tests and the FP8 tests of the model,
# then the step at batch 1, 8, 32 (tp 1, rank 0 of tp 8): base (main before) against this tree, interleaved.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; md5sum tp_runtime/ops/*.py tp_runtime/model/attention.py; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider -rfE \
  tests/test_fp8_gemm_gpu.py tests/test_linear_gpu.py tests/test_pdl_gpu.py > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" | tee -a $R/env.txt; tail -15 $R/tests.log
bench() {  # bench NAME TREE
  local left=$(( 590 - $(el) )); [ $left -lt 90 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1, 8, 32]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep -E "full@fp8|full " $R/$1.log | head -12
}
for r in 1 2; do bench base_$r bench_tmp/base; bench pair_$r .; done
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
