#!/usr/bin/env bash
# The whole GPU suite on the final commit (pytest -m gpu, 16 workers), Ray from the carried wheels; then, time
# allowing, the decode step at batch 1 and 128 / 32K (both cache formats), this tree and main's before (bench_tmp/base).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/gpu_suite; mkdir -p $R; T00=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T00 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton, ray; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "ray", ray.__version__)'
  git log --oneline -1; md5sum tp_runtime/ops/indexer*.py bench_tmp/base/tp_runtime/ops/indexer*.py; md5sum tp_runtime/ops/*.py | md5sum; } > $R/env.txt 2>&1
T0=$(date +%s)
timeout -s INT 440 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -n 16 --dist load tests > $R/pytest.log 2>&1
echo "rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
tail -15 $R/pytest.log
S=$OUT/step_32k; mkdir -p $S
bench() {  # bench TREE NAME: 43 Flash layers, full graph, bf16 / FP8 caches, batch 1 and 128 at 32K
  local tree=$1 name=$2 lim=$(( 585 - $(el) )); [ $lim -gt 115 ] && lim=115
  (cd $tree && PYTHONPATH=$ROOT/.site:$tree timeout $lim python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "grid.bench.batch=[1, 128]" "grid.bench.context=[32768]" bench.output=$S/$name > $S/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $S/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
[ $(el) -lt 450 ] && bench $ROOT new
[ $(el) -lt 490 ] && bench $ROOT/bench_tmp/base base
find $S -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
cat $R/env.txt
cd $OUT && tar czf suite.tgz gpu_suite step_32k && rm -rf gpu_suite step_32k && ls -la
