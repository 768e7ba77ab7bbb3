"""Measurement primitives of the benchmarks: step timers, eager-break timers, copy bandwidth,
all-reduce latency (eager and inside a CUDA graph), and the statistics of a comparison.

On CUDA every duration comes from CUDA events read after one synchronize at the end; on CPU from
time.perf_counter (the host clock; CPU kernels are synchronous). A record's `timer` names which one
(timing.timer_name).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from tp_runtime.executor.timing import StepTimer
from tp_runtime.graph_timer import graph_timing, time_calls
from tp_runtime.parallel.group import TPGroup


class BreakTimer:
    """The `on_break` hook of Worker.step: times each eager call of a replayed step, on the device
    timeline (CUDA events; on CPU the host clock) and on the host clock.

    Call `next_step()` before each step and `step_done(host_ms)` after it; `per_step_ms()` gives the
    summed eager time of each step, `per_step_ms(host=True)` the host time spent inside eager calls.
    The two differ when the GPU waits (an all-reduce held by a slower rank) while the host already
    issues the next break: then the device time of a break undercounts what the host spends in it.
    """

    def __init__(self, device: torch.device):
        self.timer = StepTimer(device)
        self.host_ms: list[float] = []
        self.step_host_ms: list[float] = []
        self.step_of: list[int] = []
        self.steps = -1
        self.calls = 0

    def next_step(self) -> None:
        self.steps += 1

    def step_done(self, host_ms: float) -> None:
        self.step_host_ms.append(host_ms)

    def __call__(self, call: Callable[[], None]) -> None:
        t0, h0 = self.timer.now(), time.perf_counter()
        call()
        self.host_ms.append((time.perf_counter() - h0) * 1e3)
        self.timer.stop(t0)
        self.step_of.append(self.steps)
        self.calls += 1

    def per_step_ms(self, host: bool = False) -> list[float]:
        totals = [0.0] * (self.steps + 1)
        for step, d in zip(self.step_of, self.host_ms if host else self.timer.durations_ms()):
            totals[step] += d
        return totals


# ------------------------------------------------------------------ machine ceilings


GPU_MIN_MIB = 1024  # on a GPU the streams span >= 1 GiB: far past the 60 MB L2, so they measure HBM


def bandwidth(device: torch.device, mib: int, iters: int = 10) -> dict:
    """The roofline's ceiling, measured two ways over the same buffer: a device copy (bytes read + written)
    and a read-only stream (a sum; bytes read). Weight and cache reads are reads, so the roofline divides by
    the higher of the two (`roofline_GBps`); both are recorded. Medians of `iters` timed runs after one."""
    n = max(mib, GPU_MIN_MIB if device.type == "cuda" else mib) * 2**20
    src = torch.ones(n // 4, dtype=torch.float32, device=device)  # ones: the sum stays exact and finite
    dst = torch.empty_like(src)
    copy_ms = _median_ms(device, lambda: dst.copy_(src), iters)
    read_ms = _median_ms(device, lambda: src.sum(), iters)
    copy, read = 2 * n / (copy_ms * 1e-3) / 1e9, n / (read_ms * 1e-3) / 1e9
    timer = "CUDA events" if device.type == "cuda" else "perf_counter"
    return {"copy_GBps": copy, "read_GBps": read, "roofline_GBps": max(copy, read),
            "roofline_bandwidth": "copy" if copy >= read else "read", "copy_bytes": n,
            "copy_method": f"copy_ (read + write) and sum (read) of {n >> 20} MiB fp32, timed by {timer}"}


def _median_ms(device: torch.device, fn, iters: int) -> float:
    """One untimed call (first touch of the pages, lazy allocator and kernel set-up), then `iters` timed."""
    return time_calls(fn, device, warmup=1, repeats=iters).median_ms


ALLREDUCE_WARMUP = 20  # untimed all-reduces per measurement: the same count on every rank (collectives)


def allreduce_ms(tp: TPGroup, shape: tuple[int, ...], dtype: torch.dtype, iters: int,
                 warmup: int = ALLREDUCE_WARMUP) -> dict:
    """Median latency of one all-reduce of a `shape` tensor through the group's all-reduce (tp.all_reduce:
    its strategy, where set): eager, and (CUDA) inside a CUDA graph. `allreduce_ms_path` names the path
    this message took.

    The ranks meet at a barrier first (one that arrives late would otherwise count its lateness into the
    first calls), then run `warmup` untimed calls (connection and buffer set-up of this message size) before
    `iters` timed ones, each timed alone; the median of those is the latency.

    Must be called by every rank of the group in the same order (it runs collectives).
    """
    if tp.size == 1:
        return {"allreduce_ms_eager": 0.0, "allreduce_ms_graph": 0.0 if tp.device.type == "cuda" else None,
                "allreduce_ms_path": "none"}
    x = torch.zeros(shape, dtype=dtype, device=tp.device)  # zeros: repeated sums stay finite
    if tp.cpu_group is not None:
        dist.barrier(group=tp.cpu_group)
    for _ in range(warmup):
        tp.all_reduce(x)
    timer = StepTimer(tp.device)
    for _ in range(iters):
        t0 = timer.now()
        tp.all_reduce(x)
        timer.stop(t0)
    path = tp.allreduce.route(x) if tp.allreduce is not None else dist.get_backend(tp.group)
    out = {"allreduce_ms_eager": statistics.median(timer.durations_ms()), "allreduce_ms_graph": None,
           "allreduce_ms_path": path,
           "allreduce_method": f"median of {iters} calls timed one by one, after a barrier and {warmup} untimed"}
    if tp.device.type == "cuda":
        out["allreduce_ms_graph"] = _allreduce_graph_ms(tp, x, iters)
    return out


def _allreduce_graph_ms(tp: TPGroup, x: torch.Tensor, iters: int, replays: int = 5) -> float:
    """iters all-reduces captured in one CUDA graph; median replay time / iters."""
    ms = graph_timing(lambda: tp.all_reduce(x), tp.device, calls=iters, replays=replays).median_ms
    gc.collect()  # the graph (it holds NCCL or symmetric-memory work) is gone before anyone destroys the group
    return ms


# ------------------------------------------------------------------ statistics


def flat(reps: list[list[float]]) -> list[float]:
    """Every step of every repeat, in order."""
    return [x for r in reps for x in r]


def summarize_ms(xs: list[float]) -> dict:
    """median, p90, min, max of durations in ms."""
    a = np.asarray(xs, dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "min": float(a.min()), "max": float(a.max())}


def ratio_stats(num: list[list[float]], den: list[list[float]]) -> dict:
    """Ratio of medians of all steps, and the spread of per-repeat ratios (repeats interleaved A B A B)."""
    if len(num) != len(den) or not num:
        raise ValueError(f"ratio needs the same number of repeats, got {len(num)} and {len(den)}")
    per = np.asarray([statistics.median(a) / statistics.median(b) for a, b in zip(num, den)])
    return {"ratio": statistics.median(flat(num)) / statistics.median(flat(den)),
            "ratio_q1": float(np.percentile(per, 25)), "ratio_q3": float(np.percentile(per, 75)),
            "ratio_min": float(per.min()), "ratio_max": float(per.max()), "repeats": len(per)}
