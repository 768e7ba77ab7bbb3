#!/usr/bin/env bash
# GPU pass of the stage-B Triton kernels: their tests and `tp-runtime check` with runtime.kernels=triton
# (side by side), then the timing table (alone on the GPU), then the other GPU tests (runtime.kernels=auto).
# Usage (repository root, a machine with a GPU):  benchmarks/kernels_gpu.sh OUT_DIR [--sweep]
set -uo pipefail
out=${1:-out/kernels}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
{
  date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
} | tee "$out/env.txt"
flash=(configs/v4_flash.yaml model.layers=2-5 workload.requests=4 "workload.prompt_len=[130, 700]"
       "workload.decode_len=[8, 24]" runtime.max_len=1024 runtime.max_seqs=4 runtime.max_tokens_per_step=256
       parallel.tp=1 parallel.launcher=local graph.mode=full_and_breakable)
t0=$SECONDS
timeout "${PYTEST_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_kernels_gpu.py \
  >"$out/pytest_kernels.log" 2>&1 &
p1=$!
timeout "${CHECK_S:-200}" python3 -m tp_runtime.cli check "${flash[@]}" runtime.kernels=triton \
  >"$out/check_flash_triton.log" 2>&1 &
p2=$!
wait $p1; echo "pytest kernels rc=$? ($((SECONDS - t0)) s)"; tail -25 "$out/pytest_kernels.log"
wait $p2; echo "check rc=$? ($((SECONDS - t0)) s)"; tail -8 "$out/check_flash_triton.log"
timeout "${TIME_S:-120}" python3 -m benchmarks.time_kernels "$out/timing" ${2:+"$2"} >"$out/timing.log" 2>&1
echo "timing rc=$? ($((SECONDS - t0)) s)"; tail -40 "$out/timing.log"
if [ -n "${OTHER_S:-}" ]; then
  timeout "$OTHER_S" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_full_graph_gpu.py tests/test_graphs_gpu.py \
    >"$out/pytest_other.log" 2>&1
  echo "other GPU tests rc=$? ($((SECONDS - t0)) s)"; tail -6 "$out/pytest_other.log"
fi
