"""Projected tp points (`grid.shard_of_tp`): rank r's shard of tp k, measured alone on one GPU.

What is measured: one rank's kernels and bytes at tp k (its heads, its output groups, the replicated
projections and the whole caches), replayed as the configured graph, with the layer all-reduce left out.
What is not: the all-reduce itself, contention between ranks, other GPUs' clocks. A projected point is
never a measurement of tp k; it says what tp k could reach if the all-reduce cost a stated latency:

    projected_step_ms     = rank_step_ms + n_layers * projected_allreduce_us / 1000     (k > 1)
    projected_roofline_ms = rank_roofline_ms + the same all-reduce term                (the ceiling)
    projected_speedup     = projected_step_ms at k = 1 / projected_step_ms at k        (same sweep, same code)

rank_roofline_ms is the rank's own bytes (weights of its shard + the caches it reads) over the measured
read bandwidth (bench/roofline.py).
"""

from __future__ import annotations

import torch

from tp_runtime.parallel.allreduce import AllReduce
from tp_runtime.parallel.group import TPGroup

LEFT_OUT = "left out (projection: rank alone, no all-reduce)"
MATCH_KEYS = ("name", "variant", "mode", "batch", "context", "cache_fill")  # a projected point's k = 1 twin


def shard_group(rank: int, size: int, device: torch.device, requested: str) -> TPGroup:
    """Rank `rank` of a tp `size` group alone in this process: layers shard as that rank's, no process group,
    and the layer all-reduce is a no-op (path "none"). `requested` is the config's parallel.allreduce, so
    lanes of one projected shard agree with it (executor/worker.py checks a shared shard's all-reduce)."""
    ar = AllReduce(requested, "none", f"{LEFT_OUT}: rank {rank} of tp {size}", world=size)
    return TPGroup(rank=rank, size=size, device=device, allreduce=ar)


def rank_fields(step_ms: float, roofline_ms: float, n_layers: int, shard_of_tp: int, allreduce_us: float) -> dict:
    """A projected record's own fields, from its measured step and its rank's roofline (both ms)."""
    comm_ms = n_layers * allreduce_us / 1e3 if shard_of_tp > 1 else 0.0
    return {"projected": True, "rank_step_ms": step_ms, "rank_roofline_ms": roofline_ms,
            "rank_roofline_ratio": step_ms / roofline_ms, "projected_allreduce_us": allreduce_us,
            "projected_comm_ms": comm_ms, "projected_step_ms": step_ms + comm_ms,
            "projected_roofline_ms": roofline_ms + comm_ms, "projected_speedup": None,
            "projected_roofline_speedup": None, "projected_speedup_baseline": None}


def add_speedups(records: list[dict]) -> list[dict]:
    """Fill projected_speedup (and the roofline's own) of every projected point from its shard_of_tp = 1
    twin of the same sweep (same variant, mode, batch, context, cache fill); None where the sweep has none."""
    projected = [r for r in records if r.get("kind") == "point" and r.get("projected")]
    tp1 = {tuple(r[k] for k in MATCH_KEYS): r for r in projected if r["shard_of_tp"] == 1}
    for r in projected:
        base = tp1.get(tuple(r[k] for k in MATCH_KEYS))
        if base is None:
            continue
        r["projected_speedup"] = base["projected_step_ms"] / r["projected_step_ms"]
        r["projected_roofline_speedup"] = base["projected_roofline_ms"] / r["projected_roofline_ms"]
        r["projected_speedup_baseline"] = "shard_of_tp=1 point of this sweep"
    return records
