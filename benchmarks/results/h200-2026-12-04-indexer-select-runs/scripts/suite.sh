#!/usr/bin/env bash
# The whole GPU suite on the final commit (pytest -m gpu, 16 workers), Ray from the carried wheels.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/gpu_suite; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton, ray; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "ray", ray.__version__)'
  md5sum tp_runtime/ops/*.py tests/test_kernels_gpu.py; } > $R/env.txt 2>&1
T0=$(date +%s)
timeout -s INT 500 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -n 16 --dist load tests > $R/pytest.log 2>&1
echo "rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
tail -15 $R/pytest.log
cd $OUT && tar czf suite.tgz gpu_suite && rm -rf gpu_suite
