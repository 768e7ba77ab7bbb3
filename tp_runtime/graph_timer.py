"""The one timer of the benchmarks and of the start-up probes: a callable captured in a CUDA graph and its
replays timed with CUDA events, or any callable timed by itself; medians and spread.

    t = graph_timing(lambda: f(x), device, calls=10, replays=20)    # 10 calls of f back to back in one graph
    t.median_ms, t.p10_ms, t.p90_ms, t.min_ms, t.max_ms            # per call of f
    t = time_calls(lambda: x.sum(), device, warmup=3, repeats=20)   # eager, each call timed alone

Warm-up calls are never timed. On CUDA each sample is a CUDA-event pair, read after one synchronize at the
end; on CPU (no graphs there) `time_calls` falls back to the host clock (time.perf_counter; CPU kernels are
synchronous). `flush_l2` zeroes a 256 MB buffer before each timed sample, so each one reads its inputs from
memory rather than from the L2 (as triton.testing.do_bench does); `time_budget` sizes the warm-up and the
samples from time budgets, as do_bench does.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

FLUSH_BYTES = 256 << 20  # larger than any L2 (60 MB on an H200)


@dataclass(frozen=True)
class Timing:
    """Per-call milliseconds of each timed sample, and their median and spread."""

    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    @property
    def p10_ms(self) -> float:
        return _quantile(self.samples_ms, 0.1)

    @property
    def p90_ms(self) -> float:
        return _quantile(self.samples_ms, 0.9)

    def scaled(self, factor: float) -> Timing:
        """The same samples times `factor` (e.g. 1 / n for a callable that makes n calls)."""
        return Timing(tuple(s * factor for s in self.samples_ms))

    def summary(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "p10_ms": self.p10_ms, "p90_ms": self.p90_ms,
                "min_ms": self.min_ms, "max_ms": self.max_ms, "samples": len(self.samples_ms)}


def _quantile(xs: tuple[float, ...], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    s = sorted(xs)
    at = q * (len(s) - 1)
    lo = int(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


def time_calls(fn: Callable[[], object], device: torch.device, *, warmup: int = 1, repeats: int = 20,
               inner: int = 1, flush_l2: bool = False) -> Timing:
    """`warmup` untimed calls, then `repeats` samples of `inner` calls back to back; per-call ms of each."""
    for _ in range(warmup):
        fn()
    cuda = device.type == "cuda"
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush_l2 and cuda else None
    marks = []
    for _ in range(repeats):
        if flush is not None:
            flush.zero_()
        start = _now(cuda)
        for _ in range(inner):
            fn()
        marks.append((start, _now(cuda)))
    if cuda:
        torch.cuda.synchronize(device)
        return Timing(tuple(a.elapsed_time(b) / inner for a, b in marks))
    return Timing(tuple((b - a) * 1e3 / inner for a, b in marks))


def _now(cuda: bool):
    if not cuda:
        return time.perf_counter()
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def time_budget(fn: Callable[[], object], device: torch.device, *, warmup_ms: float, rep_ms: float,
                flush_l2: bool = True) -> Timing:
    """time_calls with the warm-up and the samples sized from time budgets: counts = budget / the time of
    one call, estimated over 5 calls after one (each at least 1)."""
    estimate = time_calls(fn, device, warmup=1, repeats=1, inner=5, flush_l2=flush_l2).median_ms
    return time_calls(fn, device, warmup=max(1, int(warmup_ms / max(estimate, 1e-6))),
                      repeats=max(1, int(rep_ms / max(estimate, 1e-6))), flush_l2=flush_l2)


def capture(fn: Callable[[], object], device: torch.device, calls: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn back to back. fn runs once eagerly first, on the capture stream
    (compiles, lazy set-up and collectives' connections stay out of the graph)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize(device)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph


def graph_timing(fn: Callable[[], object], device: torch.device, *, calls: int = 1, warmup: int = 1,
                 replays: int = 20, budget_ms: tuple[float, float] | None = None,
                 flush_l2: bool = False) -> Timing:
    """Per-call ms of fn: `calls` calls captured in one CUDA graph, `warmup` untimed replays, then `replays`
    replays each timed alone (or, with budget_ms = (warm-up ms, timed ms), as many as time_budget picks).
    The graph is freed (and the device synchronized) before this returns."""
    graph = capture(fn, device, calls)
    if budget_ms is None:
        t = time_calls(graph.replay, device, warmup=warmup, repeats=replays, flush_l2=flush_l2)
    else:
        t = time_budget(graph.replay, device, warmup_ms=budget_ms[0], rep_ms=budget_ms[1], flush_l2=flush_l2)
    del graph
    torch.cuda.synchronize(device)
    return t.scaled(1 / calls)
