#!/usr/bin/env bash
# One machine's share of a (multi-node) torchrun of tp_runtime: run it on every machine with the
# same node count and rendezvous endpoint, and that machine's node rank.
#
#   launch/torchrun_multinode.sh --nnodes 2 --node-rank 0 --rdzv-endpoint HOST0:29400 \
#       --nproc-per-node 8 -- configs/v4_flash.yaml parallel.tp=16        # on HOST0
#   launch/torchrun_multinode.sh --nnodes 2 --node-rank 1 --rdzv-endpoint HOST0:29400 \
#       --nproc-per-node 8 -- configs/v4_flash.yaml parallel.tp=16        # on HOST1
#
# The same through the environment: NNODES, NODE_RANK, RDZV_ENDPOINT (HOST:PORT on one of the
# machines, reachable from all), NPROC_PER_NODE (default: this machine's GPU count, else 1),
# RDZV_ID (shared run name, default tp-runtime), RDZV_BACKEND (default c10d), RDZV_JOIN_TIMEOUT
# (seconds to wait for every node, default 300), PYTHON (default python3). One node needs no
# endpoint (torchrun --standalone). nnodes x nproc-per-node must equal parallel.tp.
# Rank 0 prints the report and, last, its JSON line. If any rank dies, torchrun stops the others
# and every machine's command exits non-zero (a closed connection fails the peers' next collective
# at once; a hung peer after parallel.timeout_s).
set -euo pipefail
NNODES=${NNODES:-1}; NODE_RANK=${NODE_RANK:-0}; RDZV_ENDPOINT=${RDZV_ENDPOINT:-}
RDZV_ID=${RDZV_ID:-tp-runtime}; RDZV_BACKEND=${RDZV_BACKEND:-c10d}; RDZV_JOIN_TIMEOUT=${RDZV_JOIN_TIMEOUT:-300}
NPROC_PER_NODE=${NPROC_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}
[ "${NPROC_PER_NODE:-0}" -ge 1 ] 2>/dev/null || NPROC_PER_NODE=1
usage="usage: $0 [--nnodes N --node-rank K --rdzv-endpoint HOST:PORT] [--nproc-per-node P] [--] CONFIG [key=value ...]"
while [ $# -gt 0 ]; do
  case $1 in
    --nnodes) NNODES=$2; shift 2 ;;
    --node-rank) NODE_RANK=$2; shift 2 ;;
    --rdzv-endpoint) RDZV_ENDPOINT=$2; shift 2 ;;
    --nproc-per-node) NPROC_PER_NODE=$2; shift 2 ;;
    --rdzv-id) RDZV_ID=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
if [ "$NNODES" -gt 1 ] && [ -z "$RDZV_ENDPOINT" ]; then
  echo "error: --nnodes $NNODES needs --rdzv-endpoint HOST:PORT (or RDZV_ENDPOINT)" >&2; exit 2
fi
# Every rank: NVLink multicast off unless set otherwise; a collective past parallel.timeout_s ends
# the process instead of hanging it; output unbuffered so a failing rank's last words are kept.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-3}
export PYTHONUNBUFFERED=1
PYTHONPATH=$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}  # this checkout's tp_runtime
export PYTHONPATH
if [ "$NNODES" -eq 1 ] && [ -z "$RDZV_ENDPOINT" ]; then
  nodes=(--standalone)
else
  nodes=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --rdzv-backend "$RDZV_BACKEND" --rdzv-id "$RDZV_ID"
         --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-conf "join_timeout=$RDZV_JOIN_TIMEOUT")
fi
# torchrun with the project's signal handling (tp_runtime/parallel/torchrun_main.py): SIGINT / SIGTERM end the
# ranks and this command with one `error: interrupted (SIGINT)` line and exit status 130 / 143.
exec "${PYTHON:-python3}" -m tp_runtime.parallel.torchrun_main "${nodes[@]}" --nproc-per-node "$NPROC_PER_NODE" \
  --max-restarts 0 -m tp_runtime.engine.entry "$@"
