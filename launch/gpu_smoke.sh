#!/usr/bin/env bash
# GPU smoke run of the launchers: tp = 2 with NCCL on two GPUs of one machine, through Ray (an
# embedded instance, one {GPU: 1, CPU: 1} bundle per rank) and through torchrun, each eager and with
# graph.mode=breakable, on configs/tiny.yaml. Run from the repository root:
#
#   OUT=/tmp/smoke launch/gpu_smoke.sh
#
# Ray: when `import ray` fails and .whl/ exists (Ray's wheels for that machine's Python, e.g. from
# `pip download --only-binary=:all: --python-version 3.12 ray`), the
# wheels are installed into .site/ first. Every run is bounded by `timeout 120`. Writes, under $OUT:
# <launcher>_<mode>.log (stdout + stderr of the run), results.jsonl (each run's JSON record, plus
# "run" and "rc"), and prints a table. Exit status: 0 when every run succeeded on cuda with NCCL,
# graph runs replayed graphs, and Ray and torchrun agree (same mode) within bf16 tolerance.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu_smoke}
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import ray" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PYTHONPATH
fi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count())"; python3 -c "import ray; print('ray', ray.__version__)"; } 2>&1 | tee "$OUT/versions.txt"

run() {  # run NAME COMMAND...: log it, keep its JSON record
  local name=$1; shift
  local t0=$SECONDS
  timeout -k 10 120 "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  python3 - "$name" "$rc" "$OUT/$name.log" >> "$OUT/results.jsonl" <<'PY'
import json, sys
name, rc, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [l for l in open(log, errors="replace").read().splitlines() if l.startswith("{") and l.endswith("}")]
rec = json.loads(lines[-1]) if lines else {}
print(json.dumps({"run": name, "rc": rc, **rec}))
PY
}

common=(configs/tiny.yaml runtime.device=cuda parallel.backend=nccl)
for mode in eager breakable; do
  run "ray_$mode" python3 -m tp_runtime.cli run "${common[@]}" parallel.launcher=ray graph.mode=$mode
  run "torchrun_$mode" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m tp_runtime.engine.entry "${common[@]}" graph.mode=$mode
done

python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
runs = {r["run"]: r for r in map(json.loads, open(sys.argv[1]))}
ok = True
print(f"{'run':18s} {'rc':>3s} {'device':8s} {'graphs':9s} {'replayed':>8s} {'decode ms':>9s} {'checksum':>16s}")
for name, r in runs.items():
    good = r["rc"] == 0 and r.get("device", "").startswith("cuda") and r.get("completed") == 8
    if name.endswith("breakable"):
        good = good and r.get("graph_mode") == "breakable" and r.get("replayed_fraction", 0) > 0
    ok &= good
    med = r.get("decode_step_ms_median")
    print(f"{name:18s} {r['rc']:3d} {r.get('device', '-'):8s} {r.get('graph_mode', '-'):9s} "
          f"{r.get('replayed_fraction', 0):8.2f} {med if med is None else round(med, 3)!s:>9s} "
          f"{r.get('output_checksum', float('nan')):16.6f}{'' if good else '  FAIL'}")
# Same mode, same kernels, same GPUs: Ray and torchrun should agree to the bit; 1e-3 relative allows
# for a different NCCL algorithm choice in bf16 while a wrong rank layout would be off by far more.
for mode in ("eager", "breakable"):
    a, b = runs.get(f"ray_{mode}", {}), runs.get(f"torchrun_{mode}", {})
    if "output_checksum" in a and "output_checksum" in b:
        rel = abs(a["output_checksum"] - b["output_checksum"]) / abs(b["output_checksum"])
        print(f"ray vs torchrun ({mode}): relative checksum difference {rel:.2e}")
        ok &= rel <= 1e-3
print("gpu smoke:", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
