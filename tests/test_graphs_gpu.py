"""Breakable CUDA graphs on a GPU: replay equals eager, long contexts after short captures, tp = 2.

Run on a machine with GPUs: `pytest -m gpu tests/test_graphs_gpu.py` (two GPUs for the tp = 2 cases).
"""

from __future__ import annotations


import pytest
import torch

from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.scheduler import Scheduler
from tp_runtime.engine.workload import build_workload
from tp_runtime.graphs import BreakableGraph, _active, eager_break_during_capture
from tp_runtime.verify.check import TOLERANCES, max_rel_err, reference_outputs
from conftest import TINY_PATH as TINY, last_json, run_cli, with_settings

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# The tiny config runs in float32 (see configs/tiny.yaml). Replay runs the eager path's kernels on
# padded shapes; a GEMM of another row count may pick another kernel, so allow float32 rounding.
TOL = TOLERANCES["float32"]
MANY = ["workload.requests=12", "workload.prompt_len=[3, 90]", "workload.decode_len=[1, 40]",
        "runtime.max_seqs=12", "runtime.max_tokens_per_step=96", "runtime.prefill_chunk=40"]


def _pair(*overrides: str):
    cfg = load_config(TINY, ["parallel.tp=1", "graph.mode=breakable", *overrides])
    graph = in_process(cfg, keep_outputs=True)
    return cfg, graph, in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)


@pytest.mark.parametrize("scope", ["wide", "hoisted", "narrow"])
def test_replay_matches_eager_for_every_size(scope):
    cfg, graph, eager = _pair(f"graph.break_scope={scope}", *MANY)
    assert graph.graph["breakable"]["eager_breaks_per_step"] == 6  # one per layer
    assert graph.graph["breakable"]["segments_per_step"] == 7
    assert graph.replays_by_size == _expected_replays(cfg)  # each step padded to the next size
    assert len(graph.replays_by_size) >= 5
    assert graph.steps > graph.replayed_steps > 0  # 96-token steps exceed the largest size: eager
    assert max_rel_err(graph.outputs, eager.outputs) <= TOL
    assert max_rel_err(graph.outputs, reference_outputs(cfg, list(graph.outputs))) < TOL


def _expected_replays(cfg) -> dict[int, int]:
    rt, sizes = cfg.runtime, cfg.graph.capture_sizes
    sched = Scheduler(build_workload(cfg).requests, rt.max_seqs, rt.max_len, rt.max_tokens_per_step,
                      rt.prefill_chunk)
    counts: dict[int, int] = {}
    while (plan := sched.next_plan()) is not None:
        fits = [s for s in sizes if s >= plan.n_tokens]
        if fits:
            counts[min(fits)] = counts.get(min(fits), 0) + 1
        sched.complete(plan)
    return counts


def test_short_capture_replays_long_contexts():
    # Captured on an empty step; replayed past the window (16), past many 128-blocks, past top-K (8).
    cfg, graph, eager = _pair("workload.requests=3", "workload.prompt_lens=[1500, 700, 260]",
                              "workload.decode_lens=[24, 30, 12]", "runtime.max_len=2048")
    assert graph.replayed_steps >= 24
    assert max_rel_err(graph.outputs, eager.outputs) <= TOL
    assert max_rel_err(graph.outputs, reference_outputs(cfg, list(graph.outputs))) < TOL


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("scope", ["wide", "hoisted", "narrow"])
def test_tp2_check_with_graphs(scope):
    proc = run_cli(["check", TINY, "parallel.tp=2", "parallel.launcher=local", "graph.mode=breakable",
                   f"graph.break_scope={scope}", *MANY], timeout_s=600)
    rec = last_json(proc.stdout)
    assert proc.returncode == 0 and rec["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rec["graph_mode"] == "breakable" and "graph_vs_eager" in rec["comparisons"]


def test_break_rules_nested_inline_weak_args_and_cleanup():
    calls = []

    @eager_break_during_capture
    def inner(x: torch.Tensor, out: torch.Tensor) -> None:
        calls.append("inner")
        out.copy_(x * 2)

    @eager_break_during_capture
    def outer(x: torch.Tensor, out: torch.Tensor) -> None:
        inner(x, out)  # nested: runs inline inside outer's eager call
        out.add_(1)

    def forward(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        outer(x + 1, out)  # x + 1 lives in the graph pool
        return out * 3

    x, out = torch.zeros(4, device="cuda"), torch.zeros(4, device="cuda")
    g = BreakableGraph(torch.cuda.graph_pool_handle())
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = g.capture(forward, x, out)
    torch.cuda.synchronize()
    assert g.n_segments == 2 and g.n_breaks == 1 and _active() is None
    assert not any(isinstance(a, torch.Tensor) for a in g.items[1].args)  # args held without owning
    x.copy_(torch.arange(4.0, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ((torch.arange(4.0, device="cuda") + 1) * 2 + 1) * 3)

    def failing(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    with torch.cuda.stream(stream), pytest.raises(RuntimeError, match="boom"):
        BreakableGraph(torch.cuda.graph_pool_handle()).capture(failing, x)
    assert _active() is None  # capture state cleaned up; a new capture works
    with torch.cuda.stream(stream):
        BreakableGraph(torch.cuda.graph_pool_handle()).capture(forward, x, out)
