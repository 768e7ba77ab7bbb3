#!/usr/bin/env bash
# GPU correctness pass: the gpu-marked tests and `tp-runtime check` on tiny and Flash dimensions,
# eager and with breakable graphs (both scopes), tp = 1 and tp = 2 when two GPUs exist.
# Usage (from the repository root, on a machine with GPUs):  benchmarks/gpu_checks.sh [OUT_DIR]
# PYTEST_ARGS="tests/test_graphs_gpu.py ..." runs a subset of the GPU tests; SKIP_PYTEST=1 none;
# CHECKS="flash_tp1_full ..." runs only the named checks; PYTEST_WORKERS=N sets the pytest-xdist workers
# (default: one per core; 0 runs the tests serially). ONLY_PYTEST=1 runs the tests and no checks.
# Logs and the JSON lines land in OUT_DIR (default: $OUT or out/gpu_checks).
set -uo pipefail
out=${1:-${OUT:-out/gpu_checks}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if ! python3 -c "import ray" 2>/dev/null && [ -d .whl ]; then  # Ray carried as wheels (README: GPU machines)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
    && export PYTHONPATH=$PWD/.site:$PYTHONPATH
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
{
  date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  git rev-parse HEAD 2>/dev/null || true
} | tee "$out/env.txt"

check() {  # check NAME ARGS...: one `tp-runtime check`, its summary to the log, JSON to checks.jsonl
  local name=$1; shift
  [ -n "${CHECKS:-}" ] && [[ " $CHECKS " != *" $name "* ]] && return 0
  echo "== check $name: $*" | tee -a "$out/checks.log"
  timeout 900 python3 -m tp_runtime.cli check "$@" 2>"$out/$name.err" | tee -a "$out/checks.log" | tail -1 \
    | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['name']='$name'; print(json.dumps(d))" \
    >> "$out/checks.jsonl" || echo "check $name FAILED (see $name.err)" | tee -a "$out/checks.log"
}

if [ "${SKIP_PYTEST:-0}" != 1 ]; then
  # shellcheck disable=SC2086  # PYTEST_ARGS: test files to run (default: all of tests/)
  # pytest-xdist workers, one per CPU core (Triton compiles on the host; the tests share the GPU): the whole
  # suite took 198 s on one H200 with 16 workers, against more than 7 minutes serially. PYTEST_WORKERS=0: serial.
  workers=${PYTEST_WORKERS:-$(nproc)}
  python3 -c "import xdist" 2>/dev/null || workers=0
  xdist=(); [ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist load)
  start=$(date +%s)
  timeout 1200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15 "${xdist[@]}" ${PYTEST_ARGS:-tests/} \
    2>&1 | tee "$out/pytest_gpu.log" | tail -40
  echo "pytest -m gpu: $(( $(date +%s) - start )) s with ${workers} workers" | tee -a "$out/pytest_gpu.log"
fi
[ "${ONLY_PYTEST:-0}" = 1 ] && exit 0

flash=(configs/v4_flash.yaml model.layers=2-5 workload.requests=4 "workload.prompt_len=[130, 700]"
       "workload.decode_len=[8, 24]" runtime.max_len=1024 runtime.max_seqs=4 runtime.max_tokens_per_step=256)
check tiny_tp1_hoisted configs/tiny.yaml parallel.tp=1 parallel.launcher=local graph.mode=breakable graph.break_scope=hoisted
check tiny_tp1_full configs/tiny.yaml parallel.tp=1 parallel.launcher=local graph.mode=full_and_breakable graph.break_scope=narrow
check flash_tp1_full "${flash[@]}" parallel.tp=1 graph.mode=full_and_breakable graph.break_scope=narrow
check flash_tp1_hoisted "${flash[@]}" parallel.tp=1 graph.mode=breakable graph.break_scope=hoisted
check flash_tp1_narrow "${flash[@]}" parallel.tp=1 graph.mode=breakable graph.break_scope=narrow
# FP8 caches (584-byte rows, 132-byte keys): against the oracle that rounds the same way; `measured` gives the
# difference to bf16 caches. tiny needs 64-dim nope blocks: head_dim 72 = 64 + 8.
check tiny_tp1_full_kv_fp8 configs/tiny.yaml parallel.tp=1 parallel.launcher=local graph.mode=full_and_breakable \
  model.head_dim=72 runtime.cache_format=fp8
check flash_tp1_full_kv_fp8 "${flash[@]}" parallel.tp=1 graph.mode=full_and_breakable runtime.cache_format=fp8
check flash_tp1_narrow_kv_fp8 "${flash[@]}" parallel.tp=1 graph.mode=breakable graph.break_scope=narrow \
  runtime.cache_format=fp8
# FP8 weights with e4m3 activations (the released format's GEMMs): prefill chunks of up to 256 rows take the
# launches that read x rounded ahead (q_norm's output rounded in its own launch), decode the GEMV / in-loop rounding
check flash_tp1_full_fp8_a8 "${flash[@]}" parallel.tp=1 graph.mode=full_and_breakable runtime.weight_format=fp8 \
  runtime.fp8_activations=e4m3
if [ "$ngpu" -ge 2 ]; then
  check tiny_tp2_wide configs/tiny.yaml parallel.tp=2 parallel.launcher=local graph.mode=breakable graph.break_scope=wide
  check flash_tp2_hoisted "${flash[@]}" parallel.tp=2 parallel.launcher=local graph.mode=breakable graph.break_scope=hoisted
  check flash_tp2_narrow "${flash[@]}" parallel.tp=2 parallel.launcher=local graph.mode=breakable graph.break_scope=narrow
  check flash_tp2_eager "${flash[@]}" parallel.tp=2 parallel.launcher=local graph.mode=eager
  check flash_tp2_full "${flash[@]}" parallel.tp=2 parallel.launcher=local graph.mode=full_and_breakable
fi
echo "== summary"; cat "$out/checks.log" | grep -E "^(==|  [a-z_0-9]+ +max_rel_err|check .* FAILED)"
