#!/usr/bin/env bash
# The warp-specialized FP8-row attention kernel: its tests, the kernel sweep against the one-role kernel, the PDL
# tests of the attention, the decode step (main's tree, then this one) at batch 128 / 256, 4K.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s); ROOT=$PWD
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  md5sum tp_runtime/ops/sparse_attention*.py; git log --oneline -1 2>/dev/null; } > $R/env.txt 2>&1
timeout -k 10 -s INT 170 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_attention_wgmma_gpu.py \
  -k "ws or attn_config" > $R/tests.log 2>&1
echo "tests rc=$? $(el) s" >> $R/env.txt
tail -3 $R/tests.log
if grep -q " passed" $R/tests.log; then
  timeout -k 10 -s INT 200 python3 -m benchmarks.attention_sweep $R/sweep --cache fp8 --batches 128 256 \
    --variant wgmma,64,2 --variant wgmma_ws > $R/sweep.log 2>&1
  echo "sweep rc=$? $(el) s" >> $R/env.txt
  python3 - $R/sweep/timings.jsonl <<'PY' > $R/sweep_ab.txt 2>&1
import gzip, json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "rows" not in r:
        continue
    p = r["point"]
    cells = []
    for row in r["rows"]:
        k = (row.get("config") or {}).get("kernel", "?")
        cells.append(f"{row['variant']}:{k}={row['ms'] * 1e3 if row['ms'] else float('nan'):.1f}us(err {row['rel_err'] or 0:.1e})")
    print(p, " ".join(cells))
PY
  cat $R/sweep_ab.txt
  timeout -k 10 -s INT 100 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_pdl_gpu.py -k sparse_attention \
    > $R/pdl.log 2>&1
  echo "pdl rc=$? $(el) s" >> $R/env.txt
  tail -2 $R/pdl.log
fi
bench() {  # bench TREE NAME ARGS..: 43 Flash layers, full graph, bf16 / FP8 caches
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=$tree timeout 110 python3 -m tp_runtime.cli bench $ROOT/configs/bench_kernel_bandwidth.yaml \
    "$@" bench.output=$R/$name > $R/$name.log 2>&1)
  echo "$name rc=$? $(el) s" >> $R/env.txt
  cat $R/$name/*/profile_view.txt 2>/dev/null | grep -v "^---\|^lane\|^$"
}
[ $(el) -lt 380 ] && bench $ROOT/bench_tmp/base base_1 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
[ $(el) -lt 470 ] && bench $ROOT new_1 "grid.bench.batch=[128, 256]" "grid.bench.context=[4096]"
find $R -type f ! \( -name "*.log" -o -name "*.txt" -o -name "*.md" -o -name "*.jsonl" -o -name "summary.json" \) -delete
du -sh $R; cat $R/env.txt
cd $OUT && tar czf r1.tgz r1 && rm -rf r1 && ls -la $OUT
