"""A group's lanes: one Worker per mode (every rank) and rank 0's tp = 1 baselines, each with the sequences it
continues. Workers of one tp whose runtime settings agree share one model shard (weights, caches, buffers), and
their lanes continue the same sequences; `release_lanes` frees them before the next group."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.projection import shard_group
from tp_runtime.config import RunConfig, config_from_dict
from tp_runtime.executor.worker import Worker
from tp_runtime.parallel.group import TPGroup, single_process


@dataclass
class Seqs:
    """The sequences in slots first_slot .. first_slot + batch - 1 of one shard, shared by the lanes
    that run on it."""

    first_slot: int = 0
    fill: str = "seeded"  # how a point builds their caches: "seeded" rows or a real "prefill"
    pos: int = 0  # position of every slot's next decode token
    fill_s: float | None = None  # seconds the point's cache fill took


@dataclass
class Lane:
    """One Worker under test and the sequences it continues."""

    name: str  # the mode, or "tp1:<mode>" for a baseline
    mode: str
    worker: Worker | None  # None on ranks other than 0 for a baseline
    seqs: Seqs
    baseline: bool = False
    replayed: int = 0  # timed decode steps that replayed a graph
    finite: bool = True  # every output of the timed steps was finite

    def on(self, tp: TPGroup, fn: Callable[[], None]) -> None:
        """Run fn for this lane: a baseline runs on rank 0 while the other ranks wait at a barrier."""
        if not self.baseline:
            fn()
            return
        if tp.rank == 0:
            fn()
        if tp.size > 1:
            dist.barrier(group=tp.cpu_group)


def build_lanes(env: BenchEnv, group: dict) -> list[Lane]:
    """One Worker per mode (every rank) on one shard per weight format, then rank 0's tp = 1 baselines on
    others; on failure the built ones are freed (graphs must be gone before the process group is destroyed)."""
    lanes: list[Lane] = []
    try:
        _add_main_lanes(env, group, lanes)
        _add_baselines(env, group, lanes)
    except BaseException:
        release_lanes(env, lanes)
        raise
    if env.tp.size > 1:
        dist.barrier(group=env.tp.cpu_group)  # nobody starts stepping while rank 0 still builds baselines
    return lanes


def _add_main_lanes(env: BenchEnv, group: dict, lanes: list[Lane]) -> None:
    shards: dict[tuple, tuple] = {}  # shard_key -> (shard, the sequences its lanes continue)
    for mode, d in group["workers"].items():
        cfg = config_from_dict(d, f"{env.name} {mode}")
        shard, seqs = shards.get(shard_key(cfg), (None, Seqs()))
        worker = env.session.worker(cfg, lane_group(env, group, cfg.parallel.allreduce), shard=shard)
        shards[shard_key(cfg)] = (worker.shard, seqs)
        lanes.append(Lane(mode, mode, worker, seqs))


def _add_baselines(env: BenchEnv, group: dict, lanes: list[Lane]) -> None:
    """Rank 0's tp = 1 Workers of the group's modes (None on the other ranks, which only keep count)."""
    shards: dict[tuple, tuple] = {}
    single = single_process(env.tp.device)
    for mode, d in group.get("baselines", {}).items():
        cfg = config_from_dict(d, f"{env.name} tp1 {mode}")
        shard, seqs = shards.get(shard_key(cfg), (None, Seqs()))
        worker = Worker(cfg, single, shard=shard) if env.tp.rank == 0 else None
        shards[shard_key(cfg)] = (worker.shard if worker is not None else None, seqs)
        lanes.append(Lane(f"tp1:{mode}", mode, worker, seqs, baseline=True))


def lane_group(env: BenchEnv, group: dict, allreduce: str) -> TPGroup:
    """The group a main lane's Worker is built on: the launch's, or (grid.shard_of_tp) rank shard_rank of a
    tp shard_of_tp group alone in this process, its all-reduce a no-op (bench/projection.py)."""
    if "shard_of_tp" not in group:
        return env.tp
    return shard_group(group["shard_rank"], group["shard_of_tp"], env.tp.device, allreduce)


def shard_key(cfg: RunConfig) -> tuple:
    """Lanes whose runtime sections (and at tp > 1 all-reduce settings: the shard's layers reduce through
    the group they were built with) agree share a shard (weights, caches, buffers)."""
    allreduce = (("parallel.allreduce", cfg.parallel.allreduce),) if cfg.parallel.tp > 1 else ()
    return tuple(sorted(vars(cfg.runtime).items())) + allreduce


def release_lanes(env: BenchEnv, lanes: list[Lane]) -> None:
    """Free graphs and memory of a group's Workers; the process group stays for the next group."""
    for lane in lanes:
        if lane.worker is not None:
            env.session.release(lane.worker)
        lane.worker = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
