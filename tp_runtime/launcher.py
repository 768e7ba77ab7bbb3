"""Start the ranks of a run and return rank 0's result.

    local     tp = 1 runs in this process; tp > 1 starts one process per rank through torch's
              elastic agent (the machinery behind torchrun) with a c10d rendezvous on a free port
    ray       one actor per rank in a placement group (ray_launch.py)
    torchrun  the processes already exist: run `torchrun ... -m tp_runtime.worker CONFIG`

Every path ends in `worker.worker_entry`, the same code on every rank.
"""

from __future__ import annotations

import logging
import os
import uuid

from tp_runtime.config import RunConfig
from tp_runtime.driver import RunResult
from tp_runtime.worker import worker_entry


class LaunchError(RuntimeError):
    """A rank failed or could not start; the message names the rank and the cause."""


def launch(cfg: RunConfig, oneshot: bool = False, keep_outputs: bool = False) -> RunResult:
    p = cfg.parallel
    if p.launcher == "ray":
        from tp_runtime.ray_launch import launch_ray

        return launch_ray(cfg, oneshot=oneshot, keep_outputs=keep_outputs)
    if p.launcher == "torchrun":
        raise LaunchError("parallel.launcher=torchrun: start the ranks with "
                          "`torchrun --nproc-per-node N -m tp_runtime.worker CONFIG [key=value ...]` "
                          "(several machines: launch/torchrun_multinode.sh)")
    if p.tp == 1:
        return in_process(cfg, oneshot, keep_outputs)
    return _elastic(cfg, oneshot, keep_outputs)


def in_process(cfg: RunConfig, oneshot: bool = False, keep_outputs: bool = False) -> RunResult:
    """tp = 1 in this very process (no process group)."""
    return worker_entry(cfg.to_dict(), oneshot=oneshot, keep_outputs=keep_outputs)


def _elastic(cfg: RunConfig, oneshot: bool, keep_outputs: bool) -> RunResult:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    lc = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=cfg.parallel.tp,
        run_id=f"tp-runtime-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",  # port 0: the store picks a free port
        max_restarts=0, monitor_interval=0.1, start_method="spawn",
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.parallel.tp)))
    try:
        results = elastic_launch(lc, worker_entry)(cfg.to_dict(), oneshot, keep_outputs)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        raise LaunchError(f"rank {rank} failed (exit code {failure.exitcode}): "
                          f"{_failure_message(failure)}") from None
    return results[0]


def _failure_message(failure) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", msg)
        if isinstance(msg, dict):
            msg = msg.get("message", str(msg))
    return str(msg).strip().splitlines()[-1] if msg else "no error message (killed by a signal?)"
