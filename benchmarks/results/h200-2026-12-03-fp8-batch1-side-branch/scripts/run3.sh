#!/usr/bin/env bash
# The FP8 layers' bf16 GEMM of x on the side branch: the FP8 step at batch 1 and 8 (tp 1 and rank 0 of tp 8) on two
# trees in turn, twice: base (4e32c7d) and side (this tree), plus one bf16-weights run of this tree for the ratio.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/run3; mkdir -p $R; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; git log -1 --format=%H; git status --short | head; md5sum tp_runtime/model/attention.py bench_tmp/base/tp_runtime/model/attention.py; } > $R/env.txt 2>&1
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider "tests/test_linear_gpu.py::test_check_with_fp8_weights" > $R/check_fp8.log 2>&1
echo "check rc=$? $(el) s" | tee -a $R/env.txt; tail -2 $R/check_fp8.log
bench() {  # bench NAME TREE MODES
  local left=$(( 420 - $(el) )); [ $left -lt 40 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$PWD timeout $left python3 -m tp_runtime.cli bench configs/bench_fp8_gemm.yaml \
     "grid.bench.batch=[1, 8]" "grid.modes=$3" bench.output=$R/$1 > $R/$1.log 2>&1)
  echo "$1 rc=$? $(el) s" | tee -a $R/env.txt; rm -rf $R/$1/*/traces
  grep "full" $R/$1.log | grep "seeded" | head -8
}
bench base_1 bench_tmp/base "[full@fp8+a8]"; bench side_1 . "[full@fp8+a8]"; bench side_2 . "[full@fp8+a8]"; bench base_2 bench_tmp/base "[full@fp8+a8]"
bench side_bf16 . "[full]"
cd $OUT && tar czf run3.tgz run3 && rm -rf run3; ls -la $OUT
