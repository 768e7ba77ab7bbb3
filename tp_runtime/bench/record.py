"""A point's bench record: what one lane measured at one point, as typed parts, and its JSON line.

`BenchRecord.to_json()` writes the parts in order as one flat mapping: the keys of points.jsonl (README
"Benchmarks", benchmarks/README.md). A part that is None is left out (a point's shard_of_tp fields, timed
breaks, a prefill-built fill's throughput); the mappings other modules produce (the Worker's all-reduce choice,
the all-reduce latency, the profiler's fields, a projection's) are written as they come, key by key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

PART = {"part": True}  # a nested part that may be None: then its keys are left out
SPREAD = {"spread": True}  # a mapping whose keys are written as the record's own


def flat_json(obj: Any) -> dict:
    """A dataclass's fields in order as one mapping: nested parts flattened in place (their to_json), lists of
    parts as lists of mappings, SPREAD mappings merged, PART fields that are None left out."""
    out: dict = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(value.to_json())
        elif isinstance(value, list) and value and isinstance(value[0], Part):
            out[f.name] = [v.to_json() for v in value]
        elif f.metadata.get("spread"):
            out.update(value or {})
        elif not (value is None and f.metadata.get("part")):
            out[f.name] = value
    return out


class Part:
    """A part of a record: its JSON is its fields, in order (flat_json)."""

    def to_json(self) -> dict:
        return flat_json(self)


# ------------------------------------------------------------------ the parts


@dataclass
class ShardOf(Part):
    """A projected point: rank shard_rank's shard of tp shard_of_tp, run alone (bench/projection.py)."""

    shard_of_tp: int
    shard_rank: int
    projected: bool = True

    def to_json(self) -> dict:
        return {"projected": self.projected, "shard_of_tp": self.shard_of_tp, "shard_rank": self.shard_rank}


@dataclass
class Point(Part):
    """The fields naming a point in its records (points and comparisons)."""

    batch: int
    context: int
    variant: str  # the group's label: 'base' or the run-config axes it sets
    shard: ShardOf | None = None

    @classmethod
    def of(cls, group: dict, batch: int, context: int) -> Point:
        shard = ShardOf(group["shard_of_tp"], group["shard_rank"]) if "shard_of_tp" in group else None
        return cls(batch, context, group["label"], shard)

    @property
    def projected(self) -> bool:
        return self.shard is not None

    def to_json(self) -> dict:
        out = {"batch": self.batch, "context": self.context, "variant": self.variant}
        return out | (self.shard.to_json() if self.shard is not None else {})


@dataclass
class LaneSetup(Part):
    """What ran: the lane's sequences, the launch, the mode, and its Worker's resolved settings."""

    cache_fill: str  # "seeded" | "prefill"
    first_slot: int
    tp: int  # processes of this launch (a projected point's shard tp is shard_of_tp)
    launcher: str
    mode: str
    graph_mode: str
    break_scope: str
    graph_captured: bool
    replayed_fraction: float  # timed decode steps that replayed a graph
    graphs: dict  # graph kind -> StepGraphs.stats()
    device: str
    device_name: str
    dtype: str
    weight_format: str
    fp8_activations: str
    cache_format: str
    kernels: str
    pdl: bool
    streams: int


@dataclass
class Memory(Part):
    """Memory per rank from the stored layout (bench/roofline.py)."""

    weight_bytes_per_rank: int
    cache_bytes_per_rank: int
    memory_bytes_per_rank: int
    largest_batch_by_context: dict[str, int] | None  # GPU only


@dataclass
class ModelShape(Part):
    layers: int
    layer_ratios: list[int]
    hidden_size: int
    num_attention_heads: int


@dataclass
class StepTimes(Part):
    """The timed decode steps: repeats x timed_steps, interleaved with the point's other lanes."""

    timer: str
    warmup_steps: int
    timed_steps: int
    repeats: int
    step_ms_median: float
    step_ms_p90: float
    step_ms_min: float
    step_ms_max: float
    step_ms_repeats: list[float]  # the median of each repeat
    step_ms_ranks: list[float]  # the median on each rank
    host_ms_per_step: float  # median host ms inside Worker.step per timed step (no sync: the host's share)
    decode_tokens_per_s: float
    outputs_finite: bool


@dataclass
class TimedBreaks(Part):
    """Steps timed with per-break events (bench.break_steps, separate from the timed steps)."""

    break_step_ms_median: float
    break_host_ms_median: float
    break_step_host_ms_median: float


@dataclass
class Breaks(Part):
    break_ms_median: float
    break_fraction: float
    timed: TimedBreaks | None = field(metadata=PART)
    break_host_fraction: float
    eager_breaks_per_step: float | None
    break_source: str


@dataclass
class Profile(Part):
    """The profiler's fields (bench/profile.py: kernels, copies, GPU busy ms, top kernels; the view's) and
    how far the timed step is from its own GPU time."""

    profiler: dict = field(metadata=SPREAD)
    step_vs_gpu_busy: float | None
    profile_source: str | None
    profile_view_bytes: dict  # group -> bytes the step must move (bench/group_bytes.py)
    profile_view_bw_share: dict | None  # group -> those bytes over the view's GPU ms, a share of roofline_GBps


@dataclass
class PrefillChunk(Part):
    """The timed chunks of one prefill chunk size (an entry of prefill_by_chunk); None without timed chunks."""

    chunk: int  # tokens per chunk
    context: int | None  # tokens in the cache before the first timed chunk (the next ones follow it)
    chunk_ms: float | None  # median over the timed chunks
    tokens_per_s: float | None  # chunk / chunk_ms
    flops: int | None  # this rank's FLOPs of the first timed chunk (bench/flops.py)
    tflops: float | None  # achieved: median over the timed chunks of their FLOPs / their time
    peak_share: float | None  # tflops / bench.peak_tflops


@dataclass
class Prefill(Part):
    """The timed prefill chunks: the first bench.prefill_chunk size as the prefill_* fields, every size (one
    entry each, in the setting's order) in prefill_by_chunk."""

    prefill_chunk: int
    prefill_ms_median: float | None  # the median chunk ms
    prefill_tokens_per_s: float | None
    prefill_context: int | None
    prefill_flops: int | None
    prefill_tflops: float | None
    prefill_peak_tflops: float  # bench.peak_tflops
    prefill_peak_share: float | None
    prefill_by_chunk: list[PrefillChunk]

    @classmethod
    def of(cls, chunks: list[PrefillChunk], peak_tflops: float) -> Prefill:
        c = chunks[0]
        return cls(c.chunk, c.chunk_ms, c.tokens_per_s, c.context, c.flops, c.tflops, peak_tflops, c.peak_share,
                   chunks)


@dataclass
class AllreduceTimes(Part):
    """The point's message [batch, hidden] and its latency through the lane's group (bench/measure.py)."""

    allreduce_bytes: int
    latency: dict = field(metadata=SPREAD)


@dataclass
class Roofline(Part):
    """Bytes this rank reads over the measured bandwidth, + one all-reduce a layer at tp > 1; a projected
    point's is its rank's alone, with the projection's fields."""

    copy_GBps: float
    read_GBps: float
    roofline_GBps: float
    roofline_bandwidth: str
    copy_bytes: int
    copy_method: str
    roofline_weight_bytes: int
    roofline_cache_bytes: int
    roofline_bytes: int
    roofline_comm_ms: float
    roofline_model_ms: float
    roofline_ratio: float
    roofline_ratio_below_1: bool  # faster than the bytes allow: a ceiling was mismeasured, no result
    projection: dict | None = field(default=None, metadata=SPREAD)


@dataclass
class PrefillBuilt(Part):
    fill_prefill_tokens_per_s: float | None


@dataclass
class Fill(Part):
    """Seconds to build the (shared) cache; for a real prefill also its throughput."""

    fill_s: float
    prefill: PrefillBuilt | None = field(default=None, metadata=PART)


@dataclass
class BenchRecord(Part):
    """One lane at one point (kind "point" in points.jsonl)."""

    KIND: ClassVar[str] = "point"
    name: str
    point: Point
    lane: LaneSetup
    memory: Memory
    model: ModelShape
    steps: StepTimes
    allreduce_choice: dict = field(metadata=SPREAD)  # Worker.allreduce_report: the strategy and why
    breaks: Breaks
    profile: Profile
    prefill: Prefill
    allreduce: AllreduceTimes
    roofline: Roofline
    fill: Fill | None = field(metadata=PART)

    def to_json(self) -> dict:
        return {"kind": self.KIND, **flat_json(self)}
