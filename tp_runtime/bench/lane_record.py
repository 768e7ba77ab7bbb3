"""A lane's record at a point: each part of BenchRecord (bench/record.py) from the lane's Worker, the bench
settings, the machine's measured ceilings and what the point measured for the lane (LaneResult)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.flops import prefill_flops
from tp_runtime.bench.group_bytes import bandwidth_shares, group_bytes
from tp_runtime.bench.lanes import Lane
from tp_runtime.bench.measure import flat, summarize_ms
from tp_runtime.bench.projection import rank_fields
from tp_runtime.bench.record import (AllreduceTimes, BenchRecord, Breaks, Fill, LaneSetup, Memory, ModelShape, Point,
                                     Prefill, PrefillBuilt, PrefillChunk, Profile, Roofline, StepTimes, TimedBreaks)
from tp_runtime.bench.roofline import largest_batches, model_seconds, step_bytes
from tp_runtime.bench.steps import ChunkTimes
from tp_runtime.executor.worker import Worker
from tp_runtime.memory_model import memory_per_rank

FIT_CONTEXTS = (4096, 32768, 65536, 131072)  # contexts of the memory-fit table, beside the point's own


@dataclass
class LaneResult:
    """What one point measured for one recorded lane (bench/points.py)."""

    steps: list[list[float]]  # per repeat, per step ms
    breaks: dict | None  # steps.break_times
    profile: dict  # steps.profile_lane
    host_ms: list[float]  # per timed step: the host clock around Worker.step
    prefill: list[ChunkTimes]  # per bench.prefill_chunk size
    allreduce: dict  # the latency of the point's message through the lane's group
    per_rank_ms: list[float]  # rank -> median step ms


def build_record(env: BenchEnv, lane: Lane, point: Point, r: LaneResult) -> BenchRecord:
    w = lane.worker
    st = summarize_ms(flat(r.steps))
    # shard tp: the tp whose rank shard the lane holds; it differs from the launch's only for projected points,
    # which run rank shard_rank's shard of tp shard_of_tp alone here.
    shard_tp = w.tp.size
    return BenchRecord(
        name=env.name, point=point, lane=lane_setup(env, lane),
        memory=memory(w, shard_tp, point.context, env.machine.get("device_memory_bytes")),
        model=ModelShape(len(w.stack.ratios), list(w.stack.ratios), w.cfg.model.hidden_size,
                         w.cfg.model.num_attention_heads),
        steps=step_times(env, lane, point, r, st), allreduce_choice=w.allreduce_report,
        breaks=breaks(r.breaks, st["median"], full=w.full_graphs is not None and lane.replayed > 0),
        profile=profile(r.profile, st["median"], w, point, shard_tp, env.machine["roofline_GBps"]),
        prefill=prefill(w, r.prefill, env.s.peak_tflops),
        allreduce=AllreduceTimes(point.batch * w.cfg.model.hidden_size * w.dtype.itemsize, r.allreduce),
        roofline=roofline(env.machine, w, point, r.allreduce, st["median"], shard_tp, env.s.projected_allreduce_us),
        fill=fill(lane, point))


def lane_setup(env: BenchEnv, lane: Lane) -> LaneSetup:
    w, s = lane.worker, env.s
    cfg, rt = w.cfg, w.cfg.runtime
    return LaneSetup(
        cache_fill=lane.seqs.fill, first_slot=lane.seqs.first_slot, tp=env.tp.size, launcher=env.launcher,
        mode=lane.mode, graph_mode=cfg.graph.mode, break_scope=cfg.graph.break_scope,
        graph_captured=bool(w.graph_sets), replayed_fraction=lane.replayed / (s.repeats * s.timed_steps),
        graphs={g.kind: g.stats() for g in w.graph_sets}, device=env.machine["device"],
        device_name=env.machine["device_name"], dtype=str(w.dtype).removeprefix("torch."),
        weight_format=rt.weight_format, fp8_activations=rt.fp8_activations, cache_format=rt.cache_format,
        kernels=w.stack.kernels, pdl=w.stack.backend.pdl, streams=w.stack.streams)


def step_times(env: BenchEnv, lane: Lane, point: Point, r: LaneResult, st: dict) -> StepTimes:
    s = env.s
    return StepTimes(
        timer=env.machine["timer"], warmup_steps=s.warmup_steps, timed_steps=s.timed_steps, repeats=s.repeats,
        step_ms_median=st["median"], step_ms_p90=st["p90"], step_ms_min=st["min"], step_ms_max=st["max"],
        step_ms_repeats=[statistics.median(rep) for rep in r.steps], step_ms_ranks=r.per_rank_ms,
        host_ms_per_step=statistics.median(r.host_ms),
        decode_tokens_per_s=point.batch / (st["median"] / 1e3), outputs_finite=lane.finite)


def memory(w: Worker, tp: int, ctx: int, device_bytes: int | None) -> Memory:
    """Memory per rank from the stored layout: the lane's weights and caches as allocated (runtime.max_seqs
    slots x runtime.max_len x layers), and per context the largest batch that fits the device (GPU only)."""
    m, rt, elem, fp8, fp8_cache = w.cfg.model, w.cfg.runtime, w.dtype.itemsize, w.stack.fp8, w.stack.fp8_cache
    mem = memory_per_rank(m, tp, rt.max_seqs, rt.max_len, elem, fp8, fp8_cache)
    fits = None
    if device_bytes:
        contexts = sorted(set(FIT_CONTEXTS) | {ctx})
        fits = {str(c): b for c, b in largest_batches(m, tp, elem, device_bytes, contexts, fp8, fp8_cache).items()}
    return Memory(mem["weights"], mem["cache"], mem["weights"] + mem["cache"], fits)


def breaks(brk: dict | None, step_median: float, full: bool) -> Breaks:
    if full:  # decode steps replay one full graph: nothing runs eagerly
        return Breaks(0.0, 0.0, None, 0.0, 0, "full graph (no eager break)")
    if brk is None:  # no captured graph: the whole step runs eagerly
        return Breaks(step_median, 1.0, None, 1.0, None, "whole step (eager, no captured graph)")
    return Breaks(brk["break_ms"], brk["break_ms"] / brk["step_ms"],
                  TimedBreaks(brk["step_ms"], brk["break_host_ms"], brk["step_host_ms"]),
                  brk["break_host_ms"] / brk["step_host_ms"], brk["calls_per_step"],
                  "on_break: CUDA events and host clock around each eager call (separate steps)")


def profile(prof: dict, step_median: float, w: Worker, point: Point, tp: int, roofline_GBps: float) -> Profile:
    """The profiler's fields, and per kernel group the bytes the step must move and, where the profile view
    ran (bench.profile on a GPU), their share of the bandwidth over the group's GPU time."""
    busy = prof["gpu_busy_ms"]
    nbytes = group_bytes(w.cfg.model, tp, point.batch, point.context, w.dtype.itemsize, w.stack.fp8,
                         w.stack.fp8_cache)
    view = prof.get("profile_view_ms")
    return Profile(prof, step_median / busy if busy else None,
                   "torch profiler (CUPTI), separate untimed steps" if busy is not None else None,
                   nbytes, bandwidth_shares(nbytes, view, roofline_GBps * 1e9) if view else None)


def prefill(w: Worker, sizes: list[ChunkTimes], peak_tflops: float) -> Prefill:
    return Prefill.of([prefill_chunk(w, t, peak_tflops) for t in sizes], peak_tflops)


def prefill_chunk(w: Worker, t: ChunkTimes, peak_tflops: float) -> PrefillChunk:
    """One chunk size's times against this rank's FLOPs of each chunk (bench/flops.py)."""
    if not t.ms:
        return PrefillChunk(t.chunk, None, None, None, None, None, None)
    flops = [prefill_flops(w.cfg.model, w.tp.size, start, t.chunk) for start in t.starts]
    ms = statistics.median(t.ms)
    tflops = statistics.median(f / (d * 1e9) for f, d in zip(flops, t.ms))  # FLOP / ms / 1e9 = TFLOP/s
    return PrefillChunk(t.chunk, t.starts[0], ms, t.chunk / (ms / 1e3) if ms else None, flops[0], tflops,
                        tflops / peak_tflops)


def roofline(m: dict, w: Worker, point: Point, ar: dict, step_ms: float, tp: int,
             projected_allreduce_us: float) -> Roofline:
    """The roofline of the point (bytes this rank reads over the measured bandwidth, + one measured all-reduce
    a layer at tp > 1), its ratio, and a flag where the ratio is below 1 (faster than the bytes allow: a
    ceiling was mismeasured, so the figure is no result). A projected point's roofline is its rank's alone,
    with its projection fields (bench/projection.py)."""
    nbytes = step_bytes(w.cfg.model, tp, point.batch, point.context, w.dtype.itemsize, fp8=w.stack.fp8,
                        fp8_cache=w.stack.fp8_cache)
    n_layers = len(w.stack.ratios)
    ar_ms = ar["allreduce_ms_graph"] if ar["allreduce_ms_graph"] is not None else ar["allreduce_ms_eager"]
    ar_s = 0.0 if point.projected else ar_ms / 1e3  # a projection's all-reduce term is its own (projected_*)
    model_ms = model_seconds(nbytes.total, m["roofline_GBps"] * 1e9, n_layers, ar_s, tp) * 1e3
    return Roofline(
        copy_GBps=m["copy_GBps"], read_GBps=m["read_GBps"], roofline_GBps=m["roofline_GBps"],
        roofline_bandwidth=m["roofline_bandwidth"], copy_bytes=m["copy_bytes"], copy_method=m["copy_method"],
        roofline_weight_bytes=nbytes.weights, roofline_cache_bytes=nbytes.cache, roofline_bytes=nbytes.total,
        roofline_comm_ms=n_layers * ar_s * 1e3 if tp > 1 else 0.0, roofline_model_ms=model_ms,
        roofline_ratio=step_ms / model_ms, roofline_ratio_below_1=step_ms / model_ms < 1,
        projection=rank_fields(step_ms, model_ms, n_layers, tp, projected_allreduce_us) if point.projected else None)


def fill(lane: Lane, point: Point) -> Fill | None:
    fill_s = lane.seqs.fill_s
    if fill_s is None:
        return None
    if lane.seqs.fill != "prefill":
        return Fill(fill_s)
    return Fill(fill_s, PrefillBuilt(point.batch * point.context / fill_s if fill_s > 0 else None))
