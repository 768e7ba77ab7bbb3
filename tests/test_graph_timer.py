"""graph_timer: the samples and their statistics, the host clock on CPU, warm-up left out, budgets; on a GPU
the captured graph's replays."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from tp_runtime.graph_timer import Timing, graph_timing, time_budget, time_calls

CPU = torch.device("cpu")


def test_timing_statistics():
    t = Timing((4.0, 1.0, 3.0, 2.0, 5.0))
    assert t.median_ms == 3.0 and t.min_ms == 1.0 and t.max_ms == 5.0
    assert t.p10_ms == pytest.approx(1.4) and t.p90_ms == pytest.approx(4.6)  # numpy's linear interpolation
    assert t.scaled(0.5).samples_ms == (2.0, 0.5, 1.5, 1.0, 2.5)
    assert t.summary() == {"median_ms": 3.0, "p10_ms": pytest.approx(1.4), "p90_ms": pytest.approx(4.6),
                           "min_ms": 1.0, "max_ms": 5.0, "samples": 5}
    assert Timing((2.0, 4.0)).median_ms == 3.0


def test_time_calls_on_the_host_clock_counts_warmup_apart():
    calls = []
    t = time_calls(lambda: calls.append(1), CPU, warmup=3, repeats=4, inner=5)
    assert len(calls) == 3 + 4 * 5
    assert len(t.samples_ms) == 4 and all(s >= 0 for s in t.samples_ms)


def test_time_calls_measures_per_call_time():
    t = time_calls(lambda: time.sleep(0.002), CPU, warmup=0, repeats=3, inner=2)
    assert 1.5 <= t.median_ms < 50, t  # per call, not per sample of two calls


def test_time_budget_sizes_the_samples_from_the_estimate():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.001)

    t = time_budget(fn, CPU, warmup_ms=3, rep_ms=10, flush_l2=True)  # flush_l2 is a no-op on CPU
    assert 1 <= len(t.samples_ms) <= 10
    assert len(calls) >= 1 + 5 + 1 + len(t.samples_ms)  # the estimate's warm-up and 5 calls, >= 1 warm-up, samples
    assert statistics.median(t.samples_ms) >= 0.9


@pytest.mark.gpu
def test_graph_timing_replays_a_captured_graph():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    x = torch.zeros(1024, device=dev)
    one = graph_timing(lambda: x.add_(1), dev, calls=1, warmup=1, replays=5)
    assert float(x[0]) == 1 + 1 + 5  # the eager call, the warm replay, five timed replays
    ten = graph_timing(lambda: x.add_(1), dev, calls=10, warmup=1, replays=5)
    assert float(x[0]) == 7 + 1 + 10 * 6
    assert len(one.samples_ms) == len(ten.samples_ms) == 5 and one.median_ms > 0 and ten.median_ms > 0
