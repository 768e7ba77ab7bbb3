"""Breakable graphs at prefill sizes on a GPU (graph.breakable_capture_sizes): no step runs eagerly, a mixed
step replayed on a padded breakable graph equals it run eagerly in every break scope, and the eager warm-ups
before the captures do not sit beside the pool.

Run on a machine with one GPU: `pytest -m gpu tests/test_prefill_graphs_gpu.py`. The CPU side (validation,
size choice, a CPU run): tests/test_capture_sizes.py.
"""

from __future__ import annotations


import pytest
import torch

from conftest import TINY_PATH as TINY, with_settings
from tp_runtime.config import eager_steps_warning, load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.report import run_record
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.step_graphs import StepGraphs
from tp_runtime.executor.worker import StepRun, Worker
from tp_runtime.parallel.group import group_from_env
from tp_runtime.verify.check import TOLERANCES, max_rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# tiny runs in float32. A replay runs the captured GEMMs on the step padded to its capture size (M = 64 or
# 256 rows against the eager step's 62 or 102): cuBLAS and the M-dependent GEMM paths may pick another kernel
# or split for another M, which sums a row's products in another order. Rows are computed independently, so
# only float32 rounding differs (~1e-7 relative per GEMM, compounding over 6 layers); the stage-B kernels of
# the break work per token and see the same rows. Bitwise equality is therefore not promised; the float32
# tolerance of `check` (1e-5) is, as for every graph-vs-eager comparison of the tiny config.
TOL = TOLERANCES["float32"]

DECODE_SIZES = [8, 4, 2, 1]
PREFILL_SIZES = [256, 192, 128, 96, 64, 32, 16]
RUN = ["parallel.tp=1", "runtime.device=cuda", "graph.mode=full_and_breakable", "graph.break_scope=narrow",
       f"graph.capture_sizes={DECODE_SIZES}", f"graph.breakable_capture_sizes={PREFILL_SIZES}",
       "runtime.max_seqs=8", "runtime.max_tokens_per_step=256", "runtime.prefill_chunk=96", "workload.requests=12",
       "workload.prompt_len=[16, 300]", "workload.decode_len=[4, 24]"]


def test_prefill_sizes_up_to_the_step_budget_leave_no_eager_step():
    # Prefill chunks of 96 tokens and steps of up to 256: every one above the largest decode size (8).
    cfg = load_config(TINY, RUN)
    assert eager_steps_warning(cfg) is None
    run = in_process(cfg, keep_outputs=True)
    rec = run_record(cfg, run)
    assert rec["eager_steps"] == 0 and "eager" not in rec["steps_by_path"], rec["steps_by_path"]
    assert rec["steps_by_path"]["full"] > 0 and rec["steps_by_path"]["breakable"] > 0
    assert max(run.replays_by_size) > max(DECODE_SIZES), run.replays_by_size
    graphs = rec["graphs"]
    assert graphs["full"]["capture_sizes"] == DECODE_SIZES
    assert graphs["breakable"]["capture_sizes"] == PREFILL_SIZES + DECODE_SIZES
    assert graphs["full"]["graph_pool_bytes"] > 0  # the first capture into a new pool reserves segments
    for k in graphs.values():  # what the captures cost, per kind (the README points at these fields)
        assert k["capture_s"] > 0 and k["warmup_bytes"] > 0 and k["capture_peak_bytes"] >= k["graph_pool_bytes"]
    print({kind: {f: k[f] for f in ("capture_s", "warmup_bytes", "graph_pool_bytes")} for kind, k in graphs.items()})
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    assert max_rel_err(run.outputs, eager.outputs) <= TOL


# ------------------------------------------------------------------ one mixed step: replayed vs eager


def _snapshot(worker: Worker) -> list[torch.Tensor]:
    return [t.clone() for c in worker.caches for t in c.tensors()]


def _restore(worker: Worker, saved: list[torch.Tensor]) -> None:
    for t, s in zip((t for c in worker.caches for t in c.tensors()), saved):
        t.copy_(s)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# Request 0: 130 prompt tokens (one 128-token block complete), request 1: 40, request 2: a long prompt in chunks.
# Each mixed step decodes requests 0 and 1 and prefills the next chunk of request 2 (crossing its window and
# 4-token blocks): 62 tokens, padded to 64; then 102 tokens, padded to 256 (154 padding rows).
FIRST = StepPlan((SeqChunk(0, 0, 0, 130, False), SeqChunk(1, 1, 0, 40, False), SeqChunk(2, 2, 0, 48, False)))
MIXED = [(StepPlan((SeqChunk(0, 0, 130, 1, True), SeqChunk(1, 1, 40, 1, True), SeqChunk(2, 2, 48, 60, False))), 64),
         (StepPlan((SeqChunk(0, 0, 131, 1, True), SeqChunk(1, 1, 41, 1, True), SeqChunk(2, 2, 108, 100, False))), 256)]


@pytest.mark.parametrize("scope", ["wide", "hoisted", "narrow"])
def test_mixed_step_on_a_breakable_graph_equals_it_run_eagerly(scope):
    cfg = load_config(TINY, ["parallel.tp=1", "runtime.device=cuda", "graph.mode=breakable",
                             f"graph.break_scope={scope}", f"graph.capture_sizes={DECODE_SIZES}",
                             "graph.breakable_capture_sizes=[256, 64]", "runtime.max_seqs=3",
                             "runtime.max_tokens_per_step=256"])
    worker = Worker(cfg, group_from_env("cuda", "auto", 60.0))  # tp = 1 in this process
    try:
        inputs = Workload([], cfg.model.hidden_size, cfg.workload.seed)
        rows = lambda plan: inputs.step_inputs(plan, worker.device, worker.dtype)  # noqa: E731
        worker.step(FIRST, rows(FIRST))
        real = slice(0, cfg.runtime.max_seqs)  # every slot but the trash slot, where padding rows go
        for plan, size in MIXED:
            x, before = rows(plan), _snapshot(worker)
            out, run = worker.step(plan, x)
            graph_out, graph_caches = out.clone(), _snapshot(worker)
            _restore(worker, before)
            eager_out, eager_run = worker.step(plan, x, replay=False)  # the same step, eagerly, unpadded
            assert run == StepRun("breakable", size) and eager_run == StepRun("eager", None)
            err = _rel(graph_out, eager_out)
            cache_err = max(_rel(g[real], e[real]) for g, e in zip(graph_caches, _snapshot(worker)))
            print(f"{scope}, {plan.n_tokens} tokens on the {size}-token graph: output {err:.2e} "
                  f"(bitwise: {torch.equal(graph_out, eager_out)}), caches {cache_err:.2e}")
            assert err <= TOL and cache_err <= TOL
    finally:
        worker.close()


# ------------------------------------------------------------------ capture memory


MIB = 1 << 20


@pytest.mark.parametrize("full", [True, False])
def test_warm_up_memory_is_released_before_the_pool_grows(full):
    # A step whose activations are `size` MiB, freed before it returns: the warm-ups hold 32 MiB at most, and so
    # does the pool (the 16 and 8 MiB graphs reuse the 32 MiB graph's freed block). Holding the warm-ups' cached
    # blocks beside the pool would reserve 32 + 32 MiB: what a warm-up just before each breakable capture did
    # (BreakableGraph begins its segments with capture_begin, which, unlike torch.cuda.graph's context, does
    # not empty the cache first).
    dev = torch.device("cuda")

    def forward(size: int) -> torch.Tensor:
        acts = torch.ones(size * MIB // 4, device=dev)
        return acts.sum(0, keepdim=True)

    graphs = StepGraphs([32, 16, 8], dev, full=full)
    try:
        graphs.capture(forward)
        stats = graphs.stats()
        print(stats)
        assert stats["warmup_bytes"] >= 32 * MIB
        assert stats["graph_pool_bytes"] < 48 * MIB and stats["capture_peak_bytes"] < 48 * MIB
        for size in graphs.sizes:
            assert graphs.replay(size).item() == size * MIB // 4
    finally:
        graphs.close()
