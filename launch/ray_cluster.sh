#!/usr/bin/env bash
# Bring up a Ray cluster across machines for tp_runtime: the head first, then every other machine.
#
#   launch/ray_cluster.sh head                 # on the head machine (GCS on 6379, dashboard on 8265 at its IP)
#   launch/ray_cluster.sh join HEAD_IP:6379    # on each other machine
#   RAY_ADDRESS=http://HEAD_IP:8265 launch/ray_submit.sh configs/tiny.yaml parallel.tp=2
#   ray stop                                   # on each machine, when done
#
# Every Ray process started here (raylet, workers, so every rank) inherits NVLink multicast off
# (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) unless set
# otherwise. Ray counts this machine's GPUs and CPUs; tp_runtime asks one {GPU: 1, CPU: 1} bundle
# per rank. Environment: RAY_PORT (6379), DASHBOARD_PORT (8265), DASHBOARD_HOST (see below), RAY (the
# ray command), PYTHON (python3). Words after the subcommand go to `ray start` (e.g. --num-gpus 8,
# --block, --node-ip-address IP). Two nodes on one machine each need their own --temp-dir (as machines have
# their own disks): sharing one, they share Ray's runtime_resources, and one node's unpacking of a job's
# working_dir deletes it under the other's workers.
#
# The dashboard is Ray's job submission API: whoever reaches it can run any program on every node, as
# the user running Ray. It listens on DASHBOARD_HOST: by default this node's own IP (the one
# --node-ip-address gives, else Ray's choice), which the machines of the cluster use; 127.0.0.1 keeps
# it to this machine (submit from the head, or through an SSH tunnel); 0.0.0.0 exposes it on every
# interface, which only a firewall or token authentication should allow.
#
# Token authentication: the head turns it on when it finds a token (~/.ray/auth_token, which
# `ray get-auth-token --generate` creates, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH with
# RAY_AUTH_MODE=token); every joining machine and every client (ray job submit, a driver with
# RAY_ADDRESS) then needs the same token, by the same means.
set -euo pipefail
RAY_CMD=${RAY:-ray}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-3}
usage="usage: $0 head [ray start options] | $0 join HEAD_IP:PORT [ray start options]"
case ${1:-} in
  head)
    shift
    host=${DASHBOARD_HOST:-}
    prev=
    for word in "$@"; do  # --node-ip-address IP or --node-ip-address=IP
      case $word in --node-ip-address=*) host=${host:-${word#*=}} ;; esac
      [ "$prev" = --node-ip-address ] && host=${host:-$word}
      prev=$word
    done
    host=${host:-$(${PYTHON:-python3} -c 'import ray.util; print(ray.util.get_node_ip_address())')}
    echo "ray_cluster.sh: dashboard (job submission) on http://$host:${DASHBOARD_PORT:-8265}" >&2
    # shellcheck disable=SC2086  # RAY_CMD may be a word list (python -m ray.scripts.scripts)
    exec $RAY_CMD start --head --port="${RAY_PORT:-6379}" --include-dashboard=true \
      --dashboard-host="$host" --dashboard-port="${DASHBOARD_PORT:-8265}" --disable-usage-stats "$@" ;;
  join)
    [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
    address=$2
    shift 2
    # shellcheck disable=SC2086
    exec $RAY_CMD start --address="$address" --disable-usage-stats "$@" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
