#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
R=$OUT/r3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/env.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/env.txt
md5sum tp_runtime/ops/sparse_attention.py bench_tmp/base_sa.py >> $R/env.txt
timeout 200 python3 -m benchmarks.attention_sweep $R/sweep64 --batches 1 2 4 8 16 32 --jobs 14 --baseline bench_tmp/base_sa.py \
  --variant 16,32,1,8,1 --variant 16,64,1,8,1 --variant 16,64,1,8,2 --variant 64,32,1,8,2 > $R/sweep64.log 2>&1
echo "sweep64 rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 100 python3 -m benchmarks.attention_sweep $R/sweep8 --batches 1 8 16 32 --heads 8 --jobs 14 --baseline bench_tmp/base_sa.py \
  --variant 16,32,1,8,1 > $R/sweep8.log 2>&1
echo "sweep8 rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_kernels_gpu.py tests/test_fp8_cache_gpu.py \
  tests/test_attention_wgmma_gpu.py tests/test_pdl_gpu.py -k "attention or attn" > $R/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
cat $R/env.txt | grep -v "\.py$"; tail -3 $R/tests.log; cat $R/sweep64/table.md $R/sweep8/table.md
cd $OUT && tar czf r3.tgz r3 && rm -rf r3
