"""The per-rank benchmark loop. `bench_entry(cfg_dict, bench_dict)` is what every launcher runs on each
rank (the elastic agent, torchrun, Ray actors), as `worker.worker_entry` is for `run`; it returns rank
0's records and None elsewhere.

Per group (one model variant at one tp) every rank builds one Worker per mode and keeps them for all
batch and context points; with tp > 1 rank 0 also builds tp = 1 Workers of the same modes (the
baselines; the other ranks wait at a barrier while they run). The Workers of one tp share one model
shard (weights and caches): the lanes continue the same sequences, each lane's steps appending the
next positions. Per point:

    fill caches once per shard (seeded rows) -> warm-up steps ->
    `repeats` x (each lane `timed_steps` decode steps, lanes interleaved A B A B ...) ->
    steps timed with per-break events -> steps under the profiler (kernels, GPU busy time) ->
    prefill chunks -> all-reduce of [batch, hidden] -> records

The prefill check (one point per group: the smallest batch and context) runs each mode twice,
interleaved, on two sets of slots of the same shard: one filled with seeded rows, one by the real
chunked prefill; `prefill_vs_seeded` compares them.

A peer that stops answering is named and ended as under `run` (parallel/peer_watch.py: within
parallel.timeout_s, or timeout_s + one heartbeat period where a lane's all-reduce is in symmetric memory);
parallel.fail_rank / fail_step / fail_mode inject that fault into the lanes' Workers.
"""

from __future__ import annotations

import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from tp_runtime.bench.cache_fill import fill_by_prefill, fill_seeded
from tp_runtime.bench.measure import BreakTimer, allreduce_ms, bandwidth, flat, ratio_stats, summarize_ms
from tp_runtime.bench.profile import profile_steps, profile_view, view_table
from tp_runtime.bench.projection import LEFT_OUT, add_speedups, rank_fields, shard_group
from tp_runtime.bench.roofline import largest_batches, memory_per_rank, model_seconds, step_bytes
from tp_runtime.bench.sweep_config import MODES, BenchSettings, split_mode
from tp_runtime.config import config_from_dict
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.timing import StepTimer, timer_name
from tp_runtime.executor.worker import FaultyWorker, Worker
from tp_runtime.engine.workload import Workload
from tp_runtime.parallel.group import TPGroup, group_from_env, shutdown, single_process
from tp_runtime.parallel.peer_watch import PeerWatch


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


@dataclass
class BenchEnv:
    tp: TPGroup
    s: BenchSettings
    machine: dict
    launcher: str
    name: str
    watch: PeerWatch | None = None  # armed once a lane's all-reduce runs in symmetric memory
    bar: tqdm | None = None
    log: Path | None = None  # rank 0 appends every point's records here as soon as they exist
    allreduce_cache: dict = field(default_factory=dict)

    def keep(self, records: list[dict]) -> list[dict]:
        """Append records to the log (a sweep stopped part-way keeps its finished points); returns them."""
        if self.log is not None and records:
            with self.log.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        return records

    def on(self, lane: Lane, fn: Callable[[], None]) -> None:
        """Run fn for a lane: a baseline runs on rank 0 while the other ranks wait at a barrier."""
        if not lane.baseline:
            fn()
            return
        if self.tp.rank == 0:
            fn()
        if self.tp.size > 1:
            dist.barrier(group=self.tp.cpu_group)

    def allreduce(self, tp: TPGroup, batch: int, hidden: int, dtype: torch.dtype) -> dict:
        """All-reduce latency of the step's message [batch, hidden] through a lane's group (its strategy);
        measured once per strategy setting and shape (collective: every rank asks in the same order)."""
        if tp.size > 1 and not tp.has_peers:  # a projected shard: its all-reduce is left out, not measured
            return {"allreduce_ms_eager": None, "allreduce_ms_graph": None, "allreduce_ms_path": LEFT_OUT}
        key = (tp.allreduce.requested if tp.allreduce is not None else None, batch, hidden, dtype)
        if key not in self.allreduce_cache:
            self.allreduce_cache[key] = allreduce_ms(tp, (batch, hidden), dtype, self.s.allreduce_iters)
        return self.allreduce_cache[key]


def bench_entry(cfg_dict: dict, bench_dict: dict) -> list[dict] | None:
    """Every rank: join the group (RANK set) or run tp = 1 here, run every group, return rank 0's records."""
    cfg = config_from_dict(cfg_dict)
    p = cfg.parallel
    tp = group_from_env(cfg.runtime.device, p.backend, p.timeout_s)
    env = None
    try:
        with PeerWatch(tp, p.timeout_s) as watch:  # a peer that stops answering is named, never waited on
            env = BenchEnv(tp, BenchSettings(**bench_dict["settings"]), _machine(tp, bench_dict), p.launcher,
                           bench_dict["name"], watch)
            prog = bench_dict.get("progress", {})
            if tp.rank == 0:
                env.log = partial_log(env.s.output, env.name)
                env.log.parent.mkdir(parents=True, exist_ok=True)
            env.bar = tqdm(total=prog.get("total"), initial=prog.get("offset", 0), unit="point", file=sys.stderr,
                           desc=f"bench {env.name} tp={tp.size}", disable=tp.rank != 0, dynamic_ncols=True)
            records: list[dict] = []
            for group in bench_dict["groups"]:
                records += _run_group(env, group)
            return add_speedups(records) if tp.rank == 0 else None
    finally:
        if env is not None and env.bar is not None:
            env.bar.close()
        shutdown(tp)


def partial_log(output: str, name: str) -> Path:
    """Where a sweep's records are appended point by point (points.jsonl is written at the end)."""
    return Path(output) / name / "partial.jsonl"


def _machine(tp: TPGroup, bench_dict: dict) -> dict:
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


# ------------------------------------------------------------------ one group: Workers per mode


def _build_lanes(env: BenchEnv, group: dict) -> list[Lane]:
    """One Worker per mode (every rank) on one shard per weight format, then rank 0's tp = 1 baselines on
    others; on failure the built ones are freed (graphs must be gone before the process group is destroyed)."""
    tp, lanes = env.tp, []
    try:
        shards: dict[tuple, tuple] = {}  # runtime section -> (shard, the sequences its lanes continue)
        for mode, d in group["workers"].items():
            cfg = config_from_dict(d, f"{env.name} {mode}")
            shard, seqs = shards.get(_shard_key(cfg), (None, Seqs()))
            worker_cls = FaultyWorker if cfg.parallel.fail_rank == tp.rank else Worker
            worker = worker_cls(cfg, _lane_group(env, group, cfg.parallel.allreduce), shard=shard)
            if env.watch is not None and worker.tp.allreduce is not None and worker.tp.allreduce.uses_symm:
                env.watch.arm()
            shards[_shard_key(cfg)] = (worker.shard, seqs)
            lanes.append(Lane(mode, mode, worker, seqs))
        shards, single = {}, single_process(tp.device)
        for mode, d in group.get("baselines", {}).items():
            cfg = config_from_dict(d, f"{env.name} tp1 {mode}")
            shard, seqs = shards.get(_shard_key(cfg), (None, Seqs()))
            worker = Worker(cfg, single, shard=shard) if tp.rank == 0 else None
            shards[_shard_key(cfg)] = (worker.shard if worker is not None else None, seqs)
            lanes.append(Lane(f"tp1:{mode}", mode, worker, seqs, baseline=True))
    except BaseException:
        _release(lanes)
        raise
    if tp.size > 1:
        dist.barrier(group=tp.cpu_group)  # nobody starts stepping while rank 0 still builds baselines
    return lanes


def _lane_group(env: BenchEnv, group: dict, allreduce: str) -> TPGroup:
    """The group a main lane's Worker is built on: the launch's, or (grid.shard_of_tp) rank shard_rank of a
    tp shard_of_tp group alone in this process, its all-reduce a no-op (bench/projection.py)."""
    if "shard_of_tp" not in group:
        return env.tp
    return shard_group(group["shard_rank"], group["shard_of_tp"], env.tp.device, allreduce)


def _point(group: dict, batch: int, context: int) -> dict:
    """The fields naming a point in its records; a projected group's say so (projected, shard_of_tp, rank)."""
    point = {"batch": batch, "context": context, "variant": group["label"]}
    if "shard_of_tp" in group:
        point.update(projected=True, shard_of_tp=group["shard_of_tp"], shard_rank=group["shard_rank"])
    return point


def _shard_key(cfg) -> tuple:
    """Lanes whose runtime sections (and at tp > 1 all-reduce settings: the shard's layers reduce through
    the group they were built with) agree share a shard (weights, caches, buffers)."""
    allreduce = (("parallel.allreduce", cfg.parallel.allreduce),) if cfg.parallel.tp > 1 else ()
    return tuple(sorted(vars(cfg.runtime).items())) + allreduce


def _release(lanes: list[Lane]) -> None:
    """Free graphs and memory of a group's Workers; the process group stays for the next group."""
    for lane in lanes:
        if lane.worker is not None:
            lane.worker.release_graphs()
        lane.worker = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_group(env: BenchEnv, group: dict) -> list[dict]:
    lanes = _build_lanes(env, group)
    try:
        records: list[dict] = []
        for context in group["contexts"]:
            for batch in group["batches"]:
                records += env.keep(_run_point(env, group, lanes, batch, context))
                if env.bar is not None:
                    env.bar.update()
        if env.s.prefill_check:
            records += env.keep(_prefill_check(env, group, [lane for lane in lanes if not lane.baseline]))
        return records
    finally:
        _release(lanes)


# ------------------------------------------------------------------ one point


def _run_point(env: BenchEnv, group: dict, lanes: list[Lane], batch: int, context: int) -> list[dict]:
    """Every lane at (batch, context): point records of the main lanes and the comparisons."""
    m = _measure(env, lanes, batch, context)
    if env.tp.rank != 0:
        return []
    point = _point(group, batch, context)
    return _records(env, m, point) + _comparisons(env, lanes, m.steps, point,
                                                  _PAIRS + _tp_pairs(lanes) + _allreduce_pairs(lanes))


def _prefill_check(env: BenchEnv, group: dict, main: list[Lane]) -> list[dict]:
    """The smallest batch and context once more: each mode on seeded slots 0..b-1 and on slots b..2b-1
    built by the real prefill, interleaved; records of the prefilled lanes and prefill_vs_seeded."""
    batch, context = min(group["batches"]), min(group["contexts"])
    prefilled = Seqs(first_slot=batch, fill="prefill")
    checked = [Lane(f"prefill:{lane.mode}", lane.mode, lane.worker, prefilled) for lane in main]
    m = _measure(env, main + checked, batch, context, recorded=checked)
    if env.tp.rank != 0:
        return []
    point = _point(group, batch, context)
    pairs = [("prefill_vs_seeded", c.name, lane.name) for c, lane in zip(checked, main)]
    return _records(env, m, point) + _comparisons(env, main + checked, m.steps, point, pairs)


@dataclass
class Measured:
    """What one point measured, before it becomes records (per_rank is None on ranks other than 0)."""

    lanes: list[Lane]  # the lanes that get records (breaks and prefill measured too)
    steps: dict[str, list[list[float]]]  # lane name -> per repeat, per step ms
    breaks: dict[str, dict | None]
    profiles: dict[str, dict]
    prefill: dict[str, list[float]]
    allreduce: dict[str, dict]  # lane name -> the all-reduce latency of the point's message through its group
    per_rank: list[dict[str, float]] | None  # rank -> lane name -> median step ms (rank 0 only)


def _measure(env: BenchEnv, lanes: list[Lane], batch: int, context: int,
             recorded: list[Lane] | None = None) -> Measured:
    """Fill every lane set's slots, warm up, time interleaved repeats; then breaks and prefill of the
    recorded lanes (default: all but the baselines) and the all-reduce."""
    s = env.s
    for lane in {id(lane.seqs): lane for lane in reversed(lanes)}.values():  # the first lane of each Seqs
        env.on(lane, lambda: _fill(lane, batch, context, s))
    steps: dict[str, list[list[float]]] = {lane.name: [] for lane in lanes}
    for lane in lanes:
        env.on(lane, lambda: _decode(lane, batch, s.warmup_steps, s.seed))
        lane.replayed, lane.finite = 0, True  # count the timed steps only
    for _ in range(s.repeats):  # interleaved: every lane's block of steps, then the next repeat
        for lane in lanes:
            env.on(lane, lambda: steps[lane.name].append(_decode(lane, batch, s.timed_steps, s.seed)))
    if recorded is None:
        recorded = [lane for lane in lanes if not lane.baseline]
    breaks = {lane.name: _break_ms(lane, batch, s) for lane in recorded}
    profiles = {lane.name: _profile(env, lane, batch, context) for lane in recorded}
    prefill = {lane.name: _prefill_ms(lane, s) for lane in recorded}
    ar = {lane.name: env.allreduce(lane.worker.tp, batch, lane.worker.cfg.model.hidden_size, lane.worker.dtype)
          for lane in recorded}
    per_rank = env.tp.gather_to_driver({n: statistics.median(flat(steps[n])) for n in breaks})
    return Measured(recorded, steps, breaks, profiles, prefill, ar, per_rank)


def _records(env: BenchEnv, m: Measured, point: dict) -> list[dict]:
    return [_record(env, lane, point, m.steps[lane.name], m.breaks[lane.name], m.profiles[lane.name],
                    m.prefill[lane.name], m.allreduce[lane.name], [r[lane.name] for r in m.per_rank]) for lane in m.lanes]


def _fill(lane: Lane, batch: int, context: int, s: BenchSettings) -> None:
    """Build the lane's slots at `context` tokens (seeded rows or real prefill); records the seconds."""
    w, first = lane.worker, lane.seqs.first_slot
    timer = StepTimer(w.device)
    t0 = timer.now()
    if lane.seqs.fill == "seeded":
        fill_seeded(w.caches, w.stack.ratios, batch, context, s.seed, first_slot=first)
    else:
        fill_by_prefill(w, batch, context, s.prefill_chunk, s.seed, first_slot=first)
    timer.stop(t0)
    lane.seqs.pos, lane.seqs.fill_s = context, timer.durations_ms()[0] / 1e3


def _decode_plan(batch: int, pos: int, first_slot: int = 0) -> StepPlan:
    slots = range(first_slot, first_slot + batch)
    return StepPlan(tuple(SeqChunk(slot, slot, pos, 1, True) for slot in slots))


def _decode(lane: Lane, batch: int, n: int, seed: int, on_break: BreakTimer | None = None,
            replay: bool = True) -> list[float]:
    """n decode steps of the lane's batch slots at their next positions; per-step ms (inputs made beforehand).
    replay=False runs the path's code eagerly (the profile view)."""
    w = lane.worker
    inputs = Workload([], w.cfg.model.hidden_size, seed)
    plans = [_decode_plan(batch, lane.seqs.pos + i, lane.seqs.first_slot) for i in range(n)]
    xs = [inputs.step_inputs(p, w.device, w.dtype) for p in plans]
    timer = StepTimer(w.device)
    outs = []
    for plan, x in zip(plans, xs):
        if on_break is not None:
            on_break.next_step()
        t0, h0 = timer.now(), time.perf_counter()
        out, run = w.step(plan, x, on_break, replay)
        timer.stop(t0)
        if on_break is not None:
            on_break.step_done((time.perf_counter() - h0) * 1e3)
        lane.replayed += int(run.size is not None)
        outs.append(out.isfinite().all())  # static output buffer: check before the next step
    lane.seqs.pos += n
    durations = timer.durations_ms()
    lane.finite = lane.finite and all(bool(f) for f in outs)
    return durations


def _break_ms(lane: Lane, batch: int, s: BenchSettings) -> dict | None:
    """Median eager-break time per step (device timeline and host clock) and the step time of the same
    steps (device timeline and host clock); None where decode steps replay no breakable graph."""
    w = lane.worker
    if w.breakable_graphs is None or w.static_decode or s.break_steps == 0:
        return None
    bt = BreakTimer(lane.worker.device)
    replayed0 = lane.replayed
    step_ms = _decode(lane, batch, s.break_steps, s.seed, bt)
    lane.replayed = replayed0  # these steps are not among the timed ones
    return {"break_ms": statistics.median(bt.per_step_ms()), "step_ms": statistics.median(step_ms),
            "break_host_ms": statistics.median(bt.per_step_ms(host=True)),
            "step_host_ms": statistics.median(bt.step_host_ms), "calls_per_step": bt.calls / max(1, s.break_steps)}


def _profile(env: BenchEnv, lane: Lane, batch: int, context: int) -> dict:
    """Kernels per step and GPU busy ms of profile_steps extra decode steps (kept out of the step times); with
    bench.profile also the view: a trace of as many eager steps of the lane's path and GPU ms by group."""
    s, replayed0 = env.s, lane.replayed
    prof = profile_steps(lambda: _decode(lane, batch, s.profile_steps, s.seed), s.profile_steps, lane.worker.device)
    if s.profile and lane.worker.device.type == "cuda" and s.profile_steps:  # every rank: the steps are collective
        trace = None
        if env.log is not None:  # rank 0 writes
            name = lane.name.replace(":", "_").replace("@", "_")
            trace = env.log.parent / "traces" / f"{name}-b{batch}-c{context}.json"
            trace.parent.mkdir(exist_ok=True)
        view = profile_view(lambda: _decode(lane, batch, s.profile_steps, s.seed, replay=False), s.profile_steps,
                            str(trace) if trace else None)
        if trace is not None:
            prof["profile_view_ms"], prof["profile_trace"] = view, trace.name
            with (env.log.parent / "profile_view.txt").open("a") as f:
                f.write(view_table([{"lane": lane.name, "batch": batch, "context": context, **view}]) + "\n\n")
    lane.replayed = replayed0
    return prof


def _prefill_ms(lane: Lane, s: BenchSettings) -> list[float]:
    """Chunks of prefill_chunk tokens appended to the lane's first slot (one untimed first); ms per chunk."""
    if s.prefill_steps == 0:
        return []
    w, n = lane.worker, s.prefill_chunk
    inputs = Workload([], w.cfg.model.hidden_size, s.seed)
    timer = StepTimer(w.device)
    for i in range(1 + s.prefill_steps):
        slot = lane.seqs.first_slot
        plan = StepPlan((SeqChunk(slot, slot, lane.seqs.pos, n, False),))
        x = inputs.step_inputs(plan, w.device, w.dtype)
        t0 = timer.now()
        w.step(plan, x)
        timer.stop(t0)
        lane.seqs.pos += n
    return timer.durations_ms()[1:]


# ------------------------------------------------------------------ records


def _record(env: BenchEnv, lane: Lane, point: dict, steps: list[list[float]], brk: dict | None, prof: dict,
            prefill: list[float], ar: dict, per_rank: list[float]) -> dict:
    w, s, m = lane.worker, env.s, env.machine
    cfg = w.cfg
    st = summarize_ms(flat(steps))
    # tp: the processes of this launch; shard_tp: the tp whose rank shard the lane holds (they differ only
    # for projected points, which run rank shard_rank's shard of tp shard_of_tp alone here).
    batch, ctx, tp, shard_tp = point["batch"], point["context"], env.tp.size, w.tp.size
    n_layers = len(w.stack.ratios)
    n_timed = s.repeats * s.timed_steps
    rec = {"kind": "point", "name": env.name, **point, "cache_fill": lane.seqs.fill,
           "first_slot": lane.seqs.first_slot, "tp": tp, "launcher": env.launcher, "mode": lane.mode,
           "graph_mode": cfg.graph.mode, "break_scope": cfg.graph.break_scope,
           "graph_captured": bool(w.graph_sets), "replayed_fraction": lane.replayed / n_timed,
           "graphs": {g.kind: g.stats() for g in w.graph_sets},
           "device": m["device"], "device_name": m["device_name"], "dtype": str(w.dtype).removeprefix("torch."),
           "weight_format": cfg.runtime.weight_format, "fp8_activations": cfg.runtime.fp8_activations,
           "cache_format": cfg.runtime.cache_format,
           "kernels": w.stack.kernels, "pdl": w.stack.backend.pdl, "streams": w.stack.streams, **_memory_fields(cfg, w, shard_tp, ctx, m.get("device_memory_bytes")),
           "layers": n_layers, "layer_ratios": list(w.stack.ratios), "hidden_size": cfg.model.hidden_size,
           "num_attention_heads": cfg.model.num_attention_heads, "timer": m["timer"],
           "warmup_steps": s.warmup_steps, "timed_steps": s.timed_steps, "repeats": s.repeats,
           "step_ms_median": st["median"], "step_ms_p90": st["p90"], "step_ms_min": st["min"],
           "step_ms_max": st["max"], "step_ms_repeats": [statistics.median(r) for r in steps],
           "step_ms_ranks": per_rank, "decode_tokens_per_s": batch / (st["median"] / 1e3),
           "outputs_finite": lane.finite, **w.allreduce_report}
    rec.update(_break_fields(brk, st["median"], full=w.full_graphs is not None and lane.replayed > 0))
    busy = prof["gpu_busy_ms"]
    rec.update(prof, step_vs_gpu_busy=st["median"] / busy if busy else None,
               profile_source="torch profiler (CUPTI), separate untimed steps" if busy is not None else None)
    pre = statistics.median(prefill) if prefill else None
    rec.update({"prefill_chunk": s.prefill_chunk, "prefill_ms_median": pre,
                "prefill_tokens_per_s": s.prefill_chunk / (pre / 1e3) if pre else None,
                "allreduce_bytes": batch * cfg.model.hidden_size * w.dtype.itemsize, **ar})
    rec.update(_roofline_fields(m, w, point, ar, st["median"], shard_tp, s.projected_allreduce_us))
    fill_s = lane.seqs.fill_s
    if fill_s is not None:  # seconds to build the (shared) cache; for a real prefill also its throughput
        rec["fill_s"] = fill_s
        if lane.seqs.fill == "prefill":
            rec["fill_prefill_tokens_per_s"] = batch * ctx / fill_s if fill_s > 0 else None
    return rec


def _roofline_fields(m: dict, w: Worker, point: dict, ar: dict, step_ms: float, tp: int,
                     projected_allreduce_us: float) -> dict:
    """The roofline of the point (bytes this rank reads over the measured bandwidth, + one measured all-reduce
    a layer at tp > 1), its ratio, and a flag where the ratio is below 1 (faster than the bytes allow: a
    ceiling was mismeasured, so the figure is no result). A projected point's roofline is its rank's alone,
    with its projection fields (bench/projection.py)."""
    nbytes = step_bytes(w.cfg.model, tp, point["batch"], point["context"], w.dtype.itemsize, fp8=w.stack.fp8,
                        fp8_cache=w.stack.fp8_cache)
    n_layers, projected = len(w.stack.ratios), point.get("projected", False)
    ar_ms = ar["allreduce_ms_graph"] if ar["allreduce_ms_graph"] is not None else ar["allreduce_ms_eager"]
    ar_s = 0.0 if projected else ar_ms / 1e3  # a projection's all-reduce term is its own (projected_*)
    model_ms = model_seconds(nbytes.total, m["roofline_GBps"] * 1e9, n_layers, ar_s, tp) * 1e3
    comm_ms = n_layers * ar_s * 1e3 if tp > 1 else 0.0
    out = {"copy_GBps": m["copy_GBps"], "read_GBps": m["read_GBps"], "roofline_GBps": m["roofline_GBps"],
           "roofline_bandwidth": m["roofline_bandwidth"], "copy_bytes": m["copy_bytes"],
           "copy_method": m["copy_method"], "roofline_weight_bytes": nbytes.weights,
           "roofline_cache_bytes": nbytes.cache, "roofline_bytes": nbytes.total, "roofline_comm_ms": comm_ms,
           "roofline_model_ms": model_ms, "roofline_ratio": step_ms / model_ms,
           "roofline_ratio_below_1": step_ms / model_ms < 1}
    if projected:
        out.update(rank_fields(step_ms, model_ms, n_layers, tp, projected_allreduce_us))
    return out


FIT_CONTEXTS = (4096, 32768, 65536, 131072)  # contexts of the memory-fit table, beside the point's own


def _memory_fields(cfg, w, tp: int, ctx: int, device_bytes: int | None) -> dict:
    """Memory per rank from the stored layout: the lane's weights and caches as allocated (runtime.max_seqs
    slots x runtime.max_len x layers), and per context the largest batch that fits the device (GPU only)."""
    rt, elem = cfg.runtime, w.dtype.itemsize
    mem = memory_per_rank(cfg.model, tp, rt.max_seqs, rt.max_len, elem, w.stack.fp8, w.stack.fp8_cache)
    fits = None
    if device_bytes:
        contexts = sorted(set(FIT_CONTEXTS) | {ctx})
        fits = {str(c): b for c, b in largest_batches(cfg.model, tp, elem, device_bytes, contexts, w.stack.fp8,
                                                      w.stack.fp8_cache).items()}
    return {"weight_bytes_per_rank": mem["weights"], "cache_bytes_per_rank": mem["cache"],
            "memory_bytes_per_rank": mem["weights"] + mem["cache"], "largest_batch_by_context": fits}


def _break_fields(brk: dict | None, step_median: float, full: bool) -> dict:
    if full:  # decode steps replay one full graph: nothing runs eagerly
        return {"break_ms_median": 0.0, "break_fraction": 0.0, "break_host_fraction": 0.0,
                "eager_breaks_per_step": 0, "break_source": "full graph (no eager break)"}
    if brk is None:  # no captured graph: the whole step runs eagerly
        return {"break_ms_median": step_median, "break_fraction": 1.0, "break_host_fraction": 1.0,
                "eager_breaks_per_step": None, "break_source": "whole step (eager, no captured graph)"}
    return {"break_ms_median": brk["break_ms"], "break_fraction": brk["break_ms"] / brk["step_ms"],
            "break_step_ms_median": brk["step_ms"], "break_host_ms_median": brk["break_host_ms"],
            "break_step_host_ms_median": brk["step_host_ms"],
            "break_host_fraction": brk["break_host_ms"] / brk["step_host_ms"],
            "eager_breaks_per_step": brk["calls_per_step"],
            "break_source": "on_break: CUDA events and host clock around each eager call (separate steps)"}


_PAIRS = [("graphs_vs_eager", m, "eager") for m in ("breakable-wide", "breakable-hoisted", "breakable-narrow", "full",
                                                   "full_and_breakable")] + [
    ("hoisted_vs_wide", "breakable-hoisted", "breakable-wide"),
    ("narrow_vs_hoisted", "breakable-narrow", "breakable-hoisted"),
    ("full_vs_narrow", "full", "breakable-narrow"),
    ("full_vs_narrow", "full_and_breakable", "breakable-narrow")] + [
    ("fp8_vs_bf16", f"{m}@fp8", m) for m in MODES] + [
    ("triton_vs_torch", f"{m}@triton", f"{m}@torch") for m in MODES] + [
    ("fp8_vs_bf16", f"{m}@fp8+triton", f"{m}@triton") for m in MODES] + [
    ("kv_fp8_vs_bf16", f"{m}@kv_fp8", base) for m in MODES for base in (m, f"{m}@kv_bf16")] + [
    ("kv_fp8_vs_bf16", f"{m}@{k}+kv_fp8", f"{m}@{k}+kv_bf16") for m in MODES for k in ("triton", "torch", "fp8")]


def _tp_pairs(lanes: list[Lane]) -> list[tuple[str, str, str]]:
    return [("tp_vs_tp1", lane.mode, lane.name) for lane in lanes if lane.baseline]


def _allreduce_pairs(lanes: list[Lane]) -> list[tuple[str, str, str]]:
    """("allreduce_vs_nccl", lane, its @...+nccl twin) for every main lane whose twin forces NCCL."""
    def key(mode: str) -> tuple:
        base, settings = split_mode(mode)
        return base, tuple(sorted((k, v) for k, v in (settings or {}).items() if k != "allreduce"))

    nccl = {key(lane.mode): lane.name for lane in lanes
            if not lane.baseline and (split_mode(lane.mode)[1] or {}).get("allreduce") == "nccl"}
    return [("allreduce_vs_nccl", lane.name, nccl[key(lane.mode)]) for lane in lanes
            if not lane.baseline and key(lane.mode) in nccl and nccl[key(lane.mode)] != lane.name]


def _comparisons(env: BenchEnv, lanes: list[Lane], steps: dict, point: dict,
                 pairs: list[tuple[str, str, str]]) -> list[dict]:
    """Speedups (baseline time / variant time, > 1: the variant is faster) of interleaved lanes, for each
    (what, variant lane, baseline lane) of pairs whose lanes both ran."""
    names = {lane.name for lane in lanes}
    out = []
    for what, variant, base in pairs:
        if variant not in names or base not in names:
            continue
        stats = ratio_stats(steps[base], steps[variant])
        rec = {"kind": "comparison", "what": what, "name": env.name, **point, "tp": env.tp.size,
               "variant_mode": variant.removeprefix("prefill:"), "variant_lane": variant, "baseline": base,
               "device": env.machine["device"], "interleaved": True,
               "variant_ms_median": statistics.median(flat(steps[variant])),
               "baseline_ms_median": statistics.median(flat(steps[base])),
               **{k.replace("ratio", "speedup"): v for k, v in stats.items()}}
        if what == "tp_vs_tp1":
            rec["efficiency"] = rec["speedup"] / env.tp.size
        out.append(rec)
    return out
