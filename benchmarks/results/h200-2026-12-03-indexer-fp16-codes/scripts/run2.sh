#!/usr/bin/env bash
# FP8 keys' codes widened to fp16 in the score kernel: tests, the sweep against main's file, the decode step
# (main's tree, then this one), the top-K in parts at batch 1 and 8 / 32K.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/s2; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git log -1 --format=%H; git status --short | head; md5sum tp_runtime/ops/indexer_topk.py bench_tmp/base/tp_runtime/ops/indexer_topk.py bench_tmp/s2/*.py; } > $R/env.txt 2>&1
timeout 80 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_fp8_cache_gpu.py tests/test_kernels_gpu.py \
  -k "pipeline_depth or decoded_keys or fp8_topk or fp8_dot_topk" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt
timeout 90 python3 -m benchmarks.indexer_sweep $R/sweep --rounds 2 --batches 1 128 256 --contexts 4096 32768 \
  --variants default s3 > $R/sweep.log 2>&1
echo "sweep rc=$? $(el) s" >> $R/env.txt
bench() {  # bench TREE NAME: 43 Flash layers, full graph, bf16 / FP8 caches, batch 1 and 128 at 4K and 32K
  (cd $1 && PYTHONPATH=$1 timeout 140 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "grid.bench.batch=[1, 128]" "grid.bench.context=[4096, 32768]" bench.output=$R/$2 > $R/$2.log 2>&1)
  echo "$2 rc=$? $(el) s" >> $R/env.txt
}
bench $ROOT/bench_tmp/base base_1
bench $ROOT new_1
[ $(el) -lt 300 ] && timeout 45 python3 bench_tmp/s2/select_diag.py > $R/select_diag.log 2>&1
echo "select_diag rc=$? $(el) s" >> $R/env.txt
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; tail -3 $R/tests.log; cat $R/env.txt | tail -6; cat $R/sweep/table.md; cat $R/select_diag.log
for d in base_1 new_1; do echo "== $d"; cat $R/$d/*/profile_view.txt 2>/dev/null; grep -h "ms" $R/$d.log | tail -12; done
cd $OUT && tar czf s2.tgz s2 && rm -rf s2 && ls -la $OUT
