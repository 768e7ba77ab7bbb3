#!/usr/bin/env bash
# Submit a tp_runtime run to a Ray cluster as a Ray job, and wait for it.
#
#   RAY_ADDRESS=http://HEAD:8265 launch/ray_submit.sh configs/tiny.yaml parallel.tp=2
#
# This repository is the job's working directory (uploaded to the cluster; .git, .whl, .site and what
# .gitignore lists stay behind). The entrypoint is `$PYTHON -m tp_runtime.cli run CONFIG
# parallel.launcher=ray [key=value ...]`: inside the job RAY_ADDRESS names the cluster, so the run
# joins it and places one actor per rank. `ray job submit` streams the job's log (the report and
# its JSON line end it) and exits non-zero when the job fails.
#
# Environment:
#   RAY_ADDRESS       the head's dashboard, http://HEAD:8265 (required)
#   PYTHON            the interpreter, here and on the cluster (default python3)
#   RAY               the ray command (default ray)
#   RAY_SUBMIT_ARGS   more `ray job submit` options, e.g. "--submission-id tp-1 --entrypoint-num-cpus 1"
#   NCCL_*, TORCH_NCCL_*, NVSHMEM_*, TORCH_SYMM_MEM_*  copied into the job (and so to every rank);
#                     NVLink multicast stays off unless set otherwise (NCCL_NVLS_ENABLE=0, ...).
#   RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH   token authentication, see below
#
# Token authentication (the default of a head that finds a token when it starts): the head's token
# must be here too, found the way Ray finds it: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH,
# else ~/.ray/auth_token. `ray job submit` itself sends it only with RAY_AUTH_MODE=token, so when a
# token is found and RAY_AUTH_MODE is unset, this script sets RAY_AUTH_MODE=token (RAY_AUTH_MODE=
# disabled keeps it off).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
if [ -z "${RAY_ADDRESS:-}" ] || [ $# -lt 1 ]; then
  echo "usage: RAY_ADDRESS=http://HEAD:8265 $0 CONFIG [key=value ...]" >&2
  exit 2
fi
if [ -z "${RAY_AUTH_MODE:-}" ]; then
  if [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then
    export RAY_AUTH_MODE=token
  fi
fi
runtime_env=$("$PYTHON" - <<'PY'
import json, os
defaults = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
prefixes = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
env = {**defaults, **{k: v for k, v in os.environ.items() if k.startswith(prefixes)}, "PYTHONUNBUFFERED": "1"}
print(json.dumps({"env_vars": env, "excludes": [".git", ".whl", ".site", "out"]}))
PY
)
config=$1
shift
# The entrypoint's words go separately: ray job submit quotes each one (shlex.join) for the job's shell.
# shellcheck disable=SC2086  # RAY and RAY_SUBMIT_ARGS are word lists on purpose
exec ${RAY:-ray} job submit --address "$RAY_ADDRESS" --working-dir "$repo" \
  --runtime-env-json "$runtime_env" ${RAY_SUBMIT_ARGS:-} -- \
  "$PYTHON" -m tp_runtime.cli run "$config" parallel.launcher=ray "$@"
