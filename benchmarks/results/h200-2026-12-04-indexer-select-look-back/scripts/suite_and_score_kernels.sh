#!/usr/bin/env bash
# The whole GPU suite on the final commit (pytest -m gpu, 16 workers), Ray from the carried wheels; then, measurement
# only, the score kernel's launch variants at batch 1-4 / 32K
set -u
export PYTHONUNBUFFERED=1
T00=$(date +%s); el() { echo $(( $(date +%s) - T00 )); }
R=$OUT/gpu_suite; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton, ray; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "ray", ray.__version__)'
  md5sum tp_runtime/ops/*.py tests/test_kernels_gpu.py; } > $R/env.txt 2>&1
T0=$(date +%s)
timeout -s INT 480 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -n 16 --dist load tests > $R/pytest.log 2>&1
echo "rc=$? $(( $(date +%s) - T0 )) s" | tee -a $R/env.txt
tail -15 $R/pytest.log
cd $OUT && tar czf suite.tgz gpu_suite && rm -rf gpu_suite && cd - > /dev/null
S=$OUT/score_variants; mkdir -p $S; lim=$(( 585 - $(el) ))
if [ $lim -gt 40 ]; then
  export PYTHONPATH=$PWD
  timeout $lim python3 -m benchmarks.indexer_sweep $S/sweep --rounds 3 --batches 1 2 4 --contexts 32768 \
    --variants default "triton scores" s3 "runs x2" "n128 w8 s3" "score regs 96" > $S/sweep.log 2>&1
  echo "sweep rc=$? $(el) s" > $S/env.txt
  cat $S/sweep/table.md 2>/dev/null || tail -5 $S/sweep.log
  cd $OUT && tar czf score_variants.tgz score_variants && rm -rf score_variants
fi
