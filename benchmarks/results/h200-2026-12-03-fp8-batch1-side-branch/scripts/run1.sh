#!/usr/bin/env bash
# TMA GEMV: its GPU tests, a tune of M = 1 for Flash tp 1 and 8 with its candidates, then the step at batch 1
# (tp 1 and rank 0 of tp 8) on two trees in turn twice: base (main before, 4e32c7d) and tma (this tree, new table).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head -30; md5sum tp_runtime/ops/fp8_gemv_tma.py tp_runtime/ops/fp8_gemm.py tp_runtime/ops/fp8_gemm_table.json; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 170 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_fp8_gemm_gpu.py \
  -k "tma or every_launch_kind" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" | tee -a $R/env.txt; grep -E "passed|failed|Error" $R/tests.log | tail -8
PYTHONPATH=$PWD timeout 220 python3 -m benchmarks.fp8_gemm_tune --models v4_flash --tp 1 8 --buckets 1 --budget-s 120 --jobs 16 \
  --merge tp_runtime/ops/fp8_gemm_table.json --out $R/tune > $R/tune.log 2>&1
echo "tune rc=$? $(el) s" | tee -a $R/env.txt; grep "M=   1" $R/tune.log
rm -rf bench_tmp/c; mkdir -p bench_tmp/c; cp -r tp_runtime configs pyproject.toml bench_tmp/c/
[ -f $R/tune/fp8_gemm_table.json ] && cp $R/tune/fp8_gemm_table.json bench_tmp/c/tp_runtime/ops/fp8_gemm_table.json
bench() {  # bench NAME TREE
  local left=$(( 585 - $(el) )); [ $left -lt 45 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1]" "grid.modes=[full@fp8+a8]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep "full@fp8" $R/$1.log | head -2
}
for r in 1 2; do bench base_$r bench_tmp/base; bench tma_$r bench_tmp/c; done
cd $OUT && tar czf run.tgz run && rm -rf run; ls -la $OUT
