#!/usr/bin/env bash
# The GPU suite (pytest -m gpu, 16 workers) on the final kernels, the indexer's test files first, interrupted
# (SIGINT: pytest still reports) at 330 s if the device time left runs out.
set -u
T0=$(date +%s); R=$OUT/gpu_suite; mkdir -p $R
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
  && export PYTHONPATH=$PWD/.site:$PYTHONPATH
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/indexer_topk.py tp_runtime/ops/topk_select.py tests/test_kernels_gpu.py; } > $R/env.txt 2>&1
timeout -s INT -k 20 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15 -n 16 --dist load \
  $(cat bench_tmp/order.txt) > $R/pytest_gpu.log 2>&1
echo "pytest rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
grep -v "Warning\|warner" $R/pytest_gpu.log | tail -30; cat $R/env.txt
cd $OUT && tar czf gpu_suite.tgz gpu_suite && rm -rf gpu_suite
