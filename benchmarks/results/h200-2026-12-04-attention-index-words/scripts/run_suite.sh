#!/usr/bin/env bash
# The whole GPU suite on the final commit (pytest -m gpu, 16 workers), Ray from the carried wheels; then, time
# allowing, the decode step at batch 128 / 32K (both cache formats).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/gpu_suite; mkdir -p $R; T00=$(date +%s); ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton, ray; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "ray", ray.__version__)'
  git log --oneline -1; md5sum tp_runtime/ops/sparse_attention*.py; md5sum tp_runtime/ops/*.py | md5sum; } > $R/env.txt 2>&1
T0=$(date +%s)
timeout -s INT 460 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -n 16 --dist load tests > $R/pytest.log 2>&1
echo "rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
tail -15 $R/pytest.log
if [ $(( $(date +%s) - T00 )) -lt 490 ]; then
  S=$OUT/step_32k; mkdir -p $S
  timeout 90 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml "grid.bench.batch=[128]" \
    "grid.bench.context=[32768]" bench.output=$S/new_32k > $S/new_32k.log 2>&1
  echo "step rc=$?" >> $R/env.txt
  cat $S/new_32k/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
  find $S -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
fi
cd $OUT && tar czf suite.tgz gpu_suite $( [ -d step_32k ] && echo step_32k ) && rm -rf gpu_suite step_32k && ls -la
