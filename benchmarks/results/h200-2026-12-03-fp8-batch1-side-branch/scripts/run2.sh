#!/usr/bin/env bash
# bf16 GEMV against cuBLAS at the FP8 layers' bf16 x projections, then the FP8 step at batch 1 (tp 1 and rank 0 of
# tp 8) on three trees in turn: base (4e32c7d), rest (this tree: those projections on the Triton GEMV at M = 1),
# tma (rest with every Flash FP8 weight at M = 1 on the TMA GEMV, its best launch of the first tune).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run2; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; git log -1 --format=%H; git status --short | head; md5sum tp_runtime/ops/gemv.py bench_tmp/*/tp_runtime/ops/gemv.py bench_tmp/*/tp_runtime/ops/fp8_gemm_table.json; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 150 python3 -m benchmarks.gemv_bf16 --out $R/gemv_bf16.jsonl --tp 1 8 --m 1 2 4 8 --sweep > $R/gemv_bf16.log 2>&1
echo "gemv_bf16 rc=$? $(el) s" | tee -a $R/env.txt; grep -A3 "bf16 part" $R/gemv_bf16.log | head -40
bench() {  # bench NAME TREE
  local left=$(( 560 - $(el) )); [ $left -lt 45 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1]" "grid.modes=[full@fp8+a8]" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep "full@fp8" $R/$1.log | head -2
}
bench base_1 bench_tmp/base; bench rest_1 .; bench tma_1 bench_tmp/tma; bench rest_2 .; bench base_2 bench_tmp/base; bench tma_2 bench_tmp/tma
cd $OUT && tar czf run2.tgz run2 && rm -rf run2; ls -la $OUT
