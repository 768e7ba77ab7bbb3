"""The per-rank bench. `bench_entry(cfg_dict, bench_dict)` is what every launcher runs on each rank (the
elastic agent, torchrun, Ray actors), as `engine.entry.worker_entry` is for `run`; it returns rank 0's records
and None elsewhere.

Per group (one model variant at one tp) every rank builds one Worker per mode and keeps them for all batch and
context points; with tp > 1 rank 0 also builds tp = 1 Workers of the same modes (the baselines; the other
ranks wait at a barrier while they run). The Workers of one tp share one model shard (weights and caches): the
lanes continue the same sequences, each lane's steps appending the next positions (bench/lanes.py). Each point
is measured by bench/points.py; with bench.prefill_check the group ends with the prefill check.

A peer that stops answering is named and ended as under `run` (parallel/peer_watch.py: within
parallel.timeout_s, or timeout_s + one heartbeat period where a lane's all-reduce is in symmetric memory);
parallel.fail_rank / fail_step / fail_mode inject that fault into the lanes' Workers.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.lanes import build_lanes, release_lanes
from tp_runtime.bench.measure import bandwidth
from tp_runtime.bench.points import prefill_check, run_point
from tp_runtime.bench.projection import add_speedups
from tp_runtime.bench.sweep_config import BenchSettings
from tp_runtime.config import config_from_dict
from tp_runtime.engine.session import RankSession
from tp_runtime.executor.timing import timer_name
from tp_runtime.parallel.group import TPGroup
from tp_runtime.results_folder import STAGING


def bench_entry(cfg_dict: dict, bench_dict: dict) -> list[dict] | None:
    """Every rank: join the group (RANK set) or run tp = 1 here, run every group, return rank 0's records."""
    cfg = config_from_dict(cfg_dict)
    with RankSession(cfg) as session:  # a peer that stops answering is named, never waited on
        tp = session.tp
        env = BenchEnv(tp, BenchSettings(**bench_dict["settings"]), machine_info(tp, bench_dict),
                       cfg.parallel.launcher, bench_dict["name"], session)
        try:
            _open_outputs(env, bench_dict.get("progress", {}))
            records: list[dict] = []
            for group in bench_dict["groups"]:
                records += run_group(env, group)
            return add_speedups(records) if tp.rank == 0 else None
        finally:
            if env.bar is not None:
                env.bar.close()


def _open_outputs(env: BenchEnv, progress: dict) -> None:
    """Rank 0's partial log (its folder made) and progress bar (a disabled bar elsewhere)."""
    if env.tp.rank == 0:
        env.log = partial_log(env.s.output, env.name)
        env.log.parent.mkdir(parents=True, exist_ok=True)
    env.bar = tqdm(total=progress.get("total"), initial=progress.get("offset", 0), unit="point", file=sys.stderr,
                   desc=f"bench {env.name} tp={env.tp.size}", disable=env.tp.rank != 0, dynamic_ncols=True)


def partial_log(output: str, name: str) -> Path:
    """Where a sweep's records are appended point by point (points.jsonl is written at the end): the results
    folder's staging folder, moved up when the sweep finishes (results_folder.py)."""
    return Path(output) / name / STAGING / "partial.jsonl"


def machine_info(tp: TPGroup, bench_dict: dict) -> dict:
    """Facts recorded beside every point: device, versions, measured copy bandwidth (this rank's)."""
    s = bench_dict["settings"]
    dev = tp.device
    info = {"device": str(dev), "timer": timer_name(dev), "torch": torch.__version__, "host": platform.node(),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"}
    if dev.type == "cuda":
        info["device_memory_bytes"] = torch.cuda.get_device_properties(dev).total_memory
        info["cuda"] = torch.version.cuda
        v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    info.update(bandwidth(dev, s["copy_mib"]))
    return info


def run_group(env: BenchEnv, group: dict) -> list[dict]:
    """Every (context, batch) point of one group on its lanes, then the prefill check; the lanes are freed after."""
    lanes = build_lanes(env, group)
    try:
        records: list[dict] = []
        for context in group["contexts"]:
            for batch in group["batches"]:
                records += env.keep(run_point(env, group, lanes, batch, context))
                if env.bar is not None:
                    env.bar.update()
        if env.s.prefill_check:
            records += env.keep(prefill_check(env, group, [lane for lane in lanes if not lane.baseline]))
        return records
    finally:
        release_lanes(env, lanes)
