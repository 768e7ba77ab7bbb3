"""What a lane runs at a point, and how each part is timed: the cache fill, decode steps (the timed ones and
the warm-up; device time and the host's time in Worker.step), steps timed with per-break events, steps under
the profiler, and prefill chunks of each bench.prefill_chunk size. Every call is collective for the lanes of the
launch's group (ranks step together); baselines run on rank 0 alone."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from tp_runtime.bench.cache_fill import fill_by_prefill, fill_seeded
from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.lanes import Lane
from tp_runtime.bench.measure import BreakTimer
from tp_runtime.bench.profile import group_trace, kernels_by_layer_kind, profile_steps, record_trace, view_table
from tp_runtime.bench.sweep_config import BenchSettings
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.timing import StepTimer


def fill_lane(lane: Lane, batch: int, context: int, s: BenchSettings) -> None:
    """Build the lane's slots at `context` tokens (seeded rows or real prefill); records the seconds."""
    w, first = lane.worker, lane.seqs.first_slot
    timer = StepTimer(w.device)
    t0 = timer.now()
    if lane.seqs.fill == "seeded":
        fill_seeded(w.caches, w.stack.ratios, batch, context, s.seed, first_slot=first)
    else:
        fill_by_prefill(w, batch, context, max(s.prefill_chunks), s.seed, first_slot=first)
    timer.stop(t0)
    lane.seqs.pos, lane.seqs.fill_s = context, timer.durations_ms()[0] / 1e3


def decode_plan(batch: int, pos: int, first_slot: int = 0) -> StepPlan:
    """One decode token for each of slots first_slot .. first_slot + batch - 1, all at position pos."""
    slots = range(first_slot, first_slot + batch)
    return StepPlan(tuple(SeqChunk(slot, slot, pos, 1, True) for slot in slots))


@dataclass
class Block:
    """Per-step times of a block of decode steps: the device timeline (CUDA events; the host clock on a CPU)
    and the host clock around Worker.step (no sync added: on a GPU the host's share before the work is queued)."""

    ms: list[float]
    host_ms: list[float]


def decode(lane: Lane, batch: int, n: int, seed: int, on_break: BreakTimer | None = None,
           replay: bool = True) -> Block:
    """n decode steps of the lane's batch slots at their next positions (inputs made beforehand).
    replay=False runs the path's code eagerly (the profile view)."""
    w = lane.worker
    inputs = Workload([], w.cfg.model.hidden_size, seed)
    plans = [decode_plan(batch, lane.seqs.pos + i, lane.seqs.first_slot) for i in range(n)]
    xs = [inputs.step_inputs(p, w.device, w.dtype) for p in plans]
    timer, host_ms, outs = StepTimer(w.device), [], []
    for plan, x in zip(plans, xs):
        if on_break is not None:
            on_break.next_step()
        t0, h0 = timer.now(), time.perf_counter()
        out, run = w.step(plan, x, on_break, replay)
        host_ms.append((time.perf_counter() - h0) * 1e3)
        timer.stop(t0)
        if on_break is not None:
            on_break.step_done(host_ms[-1])
        lane.replayed += int(run.size is not None)
        outs.append(out.isfinite().all())  # static output buffer: check before the next step
    lane.seqs.pos += n
    durations = timer.durations_ms()
    lane.finite = lane.finite and all(bool(f) for f in outs)
    return Block(durations, host_ms)


def break_times(lane: Lane, batch: int, s: BenchSettings) -> dict | None:
    """Median eager-break time per step (device timeline and host clock) and the step time of the same
    steps (device timeline and host clock); None where decode steps replay no breakable graph."""
    w = lane.worker
    if w.breakable_graphs is None or w.static_decode or s.break_steps == 0:
        return None
    bt = BreakTimer(lane.worker.device)
    replayed0 = lane.replayed
    step_ms = decode(lane, batch, s.break_steps, s.seed, bt).ms
    lane.replayed = replayed0  # these steps are not among the timed ones
    return {"break_ms": statistics.median(bt.per_step_ms()), "step_ms": statistics.median(step_ms),
            "break_host_ms": statistics.median(bt.per_step_ms(host=True)),
            "step_host_ms": statistics.median(bt.step_host_ms), "calls_per_step": bt.calls / max(1, s.break_steps)}


def profile_lane(env: BenchEnv, lane: Lane, batch: int, context: int) -> dict:
    """Kernels per step and GPU busy ms of profile_steps extra decode steps (kept out of the step times); with
    bench.profile also the view: a trace of as many eager steps of the lane's path and GPU ms by group."""
    s, replayed0 = env.s, lane.replayed
    prof = profile_steps(lambda: decode(lane, batch, s.profile_steps, s.seed), s.profile_steps, lane.worker.device)
    if s.profile and lane.worker.device.type == "cuda" and s.profile_steps:  # every rank: the steps are collective
        prof.update(_profile_view(env, lane, batch, context))
    lane.replayed = replayed0
    return prof


def _profile_view(env: BenchEnv, lane: Lane, batch: int, context: int) -> dict:
    """The profile view of eager steps, with the stack's layer ranges on: GPU ms by group and kernels per
    layer kind (main and side stream); rank 0 writes the trace and appends the table to profile_view.txt."""
    s, trace, stack = env.s, None, lane.worker.stack
    if env.log is not None:  # rank 0 writes
        name = lane.name.replace(":", "_").replace("@", "_")
        trace = env.log.parent / "traces" / f"{name}-b{batch}-c{context}.json"
        trace.parent.mkdir(exist_ok=True)
    stack.annotate_layers = True
    try:
        events = record_trace(lambda: decode(lane, batch, s.profile_steps, s.seed, replay=False),
                              str(trace) if trace else None)
    finally:
        stack.annotate_layers = False
    if trace is None:
        return {}
    view = group_trace(events, s.profile_steps)
    with (env.log.parent / "profile_view.txt").open("a") as f:
        f.write(view_table([{"lane": lane.name, "batch": batch, "context": context, **view}]) + "\n\n")
    return {"profile_view_ms": view, "profile_trace": trace.name,
            "kernels_by_layer_kind": kernels_by_layer_kind(events, s.profile_steps)}


@dataclass
class ChunkTimes:
    """Timed prefill chunks of one size, appended to one sequence: where each began and its ms."""

    chunk: int
    starts: list[int]  # position of each timed chunk's first token (the context it ran at)
    ms: list[float]


def prefill_chunks(lane: Lane, chunk: int, s: BenchSettings) -> ChunkTimes:
    """prefill_steps chunks of `chunk` tokens appended to the lane's first slot, one untimed chunk first."""
    if s.prefill_steps == 0:
        return ChunkTimes(chunk, [], [])
    w, slot = lane.worker, lane.seqs.first_slot
    inputs = Workload([], w.cfg.model.hidden_size, s.seed)
    timer, starts = StepTimer(w.device), []
    for _ in range(1 + s.prefill_steps):
        plan = StepPlan((SeqChunk(slot, slot, lane.seqs.pos, chunk, False),))
        x = inputs.step_inputs(plan, w.device, w.dtype)
        starts.append(lane.seqs.pos)
        t0 = timer.now()
        w.step(plan, x)
        timer.stop(t0)
        lane.seqs.pos += chunk
    return ChunkTimes(chunk, starts[1:], timer.durations_ms()[1:])
