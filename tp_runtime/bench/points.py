"""One point (batch, context) of a group: every lane measured, interleaved, then rank 0's records.

    fill caches once per shard (seeded rows) -> warm-up steps ->
    `repeats` x (each lane `timed_steps` decode steps, lanes interleaved A B A B ...) ->
    steps timed with per-break events -> steps under the profiler (kernels, GPU busy time) ->
    prefill chunks -> all-reduce of [batch, hidden] -> records and comparisons

The prefill check (one point per group: the smallest batch and context) runs each mode twice, interleaved,
on two sets of slots of the same shard: one filled with seeded rows, one by the real chunked prefill;
`prefill_vs_seeded` compares them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tp_runtime.bench.comparisons import comparisons, point_pairs
from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.lane_record import LaneResult, build_record
from tp_runtime.bench.lanes import Lane, Seqs
from tp_runtime.bench.measure import flat
from tp_runtime.bench.record import Point
from tp_runtime.bench.steps import Block, break_times, decode, fill_lane, prefill_chunks, profile_lane


@dataclass
class Measured:
    """What one point measured: every lane's timed steps; per recorded lane what its record needs
    (per_rank_ms filled on rank 0 only)."""

    steps: dict[str, list[list[float]]]  # lane name -> per repeat, per step ms
    recorded: dict[str, LaneResult]  # recorded lane name -> its measurements


def run_point(env: BenchEnv, group: dict, lanes: list[Lane], batch: int, context: int) -> list[dict]:
    """Every lane at (batch, context): point records of the main lanes and the comparisons (rank 0)."""
    m = measure(env, lanes, batch, context)
    if env.tp.rank != 0:
        return []
    point = Point.of(group, batch, context)
    return records(env, lanes, m, point) + comparisons(env, lanes, m.steps, point, point_pairs(lanes))


def prefill_check(env: BenchEnv, group: dict, main: list[Lane]) -> list[dict]:
    """The smallest batch and context once more: each mode on seeded slots 0..b-1 and on slots b..2b-1
    built by the real prefill, interleaved; records of the prefilled lanes and prefill_vs_seeded."""
    batch, context = min(group["batches"]), min(group["contexts"])
    prefilled = Seqs(first_slot=batch, fill="prefill")
    checked = [Lane(f"prefill:{lane.mode}", lane.mode, lane.worker, prefilled) for lane in main]
    m = measure(env, main + checked, batch, context, recorded=checked)
    if env.tp.rank != 0:
        return []
    point = Point.of(group, batch, context)
    pairs = [("prefill_vs_seeded", c.name, lane.name) for c, lane in zip(checked, main)]
    return records(env, checked, m, point) + comparisons(env, main + checked, m.steps, point, pairs)


def records(env: BenchEnv, lanes: list[Lane], m: Measured, point: Point) -> list[dict]:
    """The JSON records of the recorded lanes, in lane order."""
    return [build_record(env, lane, point, m.recorded[lane.name]).to_json() for lane in lanes
            if lane.name in m.recorded]


def measure(env: BenchEnv, lanes: list[Lane], batch: int, context: int, recorded: list[Lane] | None = None) -> Measured:
    """Fill every lane set's slots, warm up, time interleaved repeats; then, phase by phase over the recorded
    lanes (default: all but the baselines), breaks, profile, prefill chunks and the all-reduce."""
    s = env.s
    steps, host_ms = timed_steps(env, lanes, batch, context)
    if recorded is None:
        recorded = [lane for lane in lanes if not lane.baseline]
    breaks = [break_times(lane, batch, s) for lane in recorded]
    profiles = [profile_lane(env, lane, batch, context) for lane in recorded]
    prefills = [[prefill_chunks(lane, chunk, s) for chunk in s.prefill_chunks] for lane in recorded]
    ars = [env.allreduce(lane.worker.tp, batch, lane.worker.cfg.model.hidden_size, lane.worker.dtype)
           for lane in recorded]
    per_rank = env.tp.gather_to_driver({lane.name: statistics.median(flat(steps[lane.name])) for lane in recorded})
    results = {lane.name: LaneResult(steps[lane.name], brk, prof, host_ms[lane.name], pre, ar,
                                     [r[lane.name] for r in per_rank] if per_rank is not None else [])
               for lane, brk, prof, pre, ar in zip(recorded, breaks, profiles, prefills, ars)}
    return Measured(steps, results)


def timed_steps(env: BenchEnv, lanes: list[Lane], batch: int,
                context: int) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """Fill each set of sequences once (through its first lane), warm every lane up, then `repeats` rounds of
    every lane's block of timed steps; lane name -> per repeat, per step ms, and lane name -> host ms per step."""
    s = env.s
    for lane in {id(lane.seqs): lane for lane in reversed(lanes)}.values():  # the first lane of each Seqs
        lane.on(env.tp, lambda: fill_lane(lane, batch, context, s))
    steps: dict[str, list[list[float]]] = {lane.name: [] for lane in lanes}
    host_ms: dict[str, list[float]] = {lane.name: [] for lane in lanes}
    for lane in lanes:
        lane.on(env.tp, lambda: decode(lane, batch, s.warmup_steps, s.seed))
        lane.replayed, lane.finite = 0, True  # count the timed steps only
    for _ in range(s.repeats):  # interleaved: every lane's block of steps, then the next repeat
        for lane in lanes:
            lane.on(env.tp, lambda: _keep(decode(lane, batch, s.timed_steps, s.seed), steps[lane.name],
                                            host_ms[lane.name]))
    return steps, host_ms


def _keep(block: Block, steps: list[list[float]], host_ms: list[float]) -> None:
    """A timed block's step ms as one more repeat; its host ms among the lane's timed steps."""
    steps.append(block.ms)
    host_ms += block.host_ms
