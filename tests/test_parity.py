"""End-to-end correctness on CPU: tp shards vs tp = 1 vs the float64 oracle, incremental vs one-shot.

The scenario's prompts are shorter than the window (16), equal to it, cross it, pass the point where
the indexer's top-K (8) drops entries (40 tokens -> 10 ratio-4 entries), and cross one and two
128-token blocks; 3 slots for 6 requests force slot reuse, and a 64-token budget with 48-token
chunks mixes prefill chunks with decode tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.report import run_record
from tp_runtime.engine.scheduler import Scheduler
from tp_runtime.engine.workload import build_workload
from tp_runtime.verify.check import FP8_CACHE_TOLERANCES, TOLERANCES, compare, max_rel_err, reference_outputs
from conftest import TINY_PATH as TINY, last_json, run_cli

SCENARIO = ["workload.requests=6", "workload.prompt_lens=[5, 16, 17, 40, 130, 260]",
            "workload.decode_lens=[3, 1, 0, 5, 2, 6]", "runtime.max_seqs=3"]
TOL = TOLERANCES["float32"]  # justified in check.py


@pytest.fixture(scope="module")
def scenario():
    return load_config(TINY, SCENARIO + ["parallel.tp=1"])


@pytest.fixture(scope="module")
def tp1(scenario):
    return in_process(scenario, keep_outputs=True)


def test_scenario_covers_the_boundaries(scenario):
    m, lens = scenario.model, scenario.workload.prompt_lens
    assert min(lens) < m.sliding_window < max(lens)
    assert max(lens) // 4 > m.index_topk  # top-K really drops entries
    assert max(lens) > 2 * 128 and {4, 128} <= set(m.compress_ratios[: m.num_hidden_layers])
    plans = _plans(scenario)
    assert any(p.decode_only for p in plans) and any(
        {c.decode for c in p.chunks} == {True, False} for p in plans)  # mixed steps exist
    assert len({c.slot for p in plans for c in p.chunks}) == 3  # 6 requests through 3 slots


def _plans(cfg):
    rt = cfg.runtime
    s = Scheduler(build_workload(cfg).requests, rt.max_seqs, rt.max_len, rt.max_tokens_per_step, rt.prefill_chunk)
    plans = []
    while (p := s.next_plan()) is not None:
        plans.append(p)
        s.complete(p)
    return plans


def test_tp1_matches_oracle(scenario, tp1):
    assert len(tp1.outputs) == 6 and not tp1.rejected
    assert max_rel_err(tp1.outputs, reference_outputs(scenario, list(tp1.outputs))) < TOL


def test_incremental_equals_oneshot(scenario, tp1):
    oneshot = in_process(scenario, oneshot=True, keep_outputs=True)
    assert max_rel_err(tp1.outputs, oneshot.outputs) < TOL


def test_slot_reuse_leaves_outputs_unchanged(scenario, tp1):
    one_slot = copy.deepcopy(scenario)
    one_slot.runtime.max_seqs = 1  # every request reuses slot 0 after the previous one
    assert max_rel_err(in_process(one_slot, keep_outputs=True).outputs, tp1.outputs) < TOL


def test_e4m3_indexer_queries_match_the_rounding_reference(scenario, tp1):
    # runtime.indexer_q=e4m3: the indexers score queries rounded to e4m3; the oracle rounds them where the run
    # does. No query element lands within float32 noise of an e4m3 midpoint here (measured 5.5e-7), so the
    # float32 bound holds (check.py allows FP8_CACHE_TOLERANCES for such flips); the unrounded oracle, like
    # the bf16-query run, is off by the picks the rounding changes (measured 0.17).
    cfg = copy.deepcopy(scenario)
    cfg.runtime.indexer_q = "e4m3"
    res = in_process(cfg, keep_outputs=True)
    assert len(res.outputs) == 6 and not res.rejected
    assert max_rel_err(res.outputs, reference_outputs(cfg, list(res.outputs))) < TOL
    assert max_rel_err(res.outputs, reference_outputs(cfg, list(res.outputs), indexer_q="bf16")) > 1e-2
    assert max_rel_err(res.outputs, tp1.outputs) > 1e-2
    assert run_record(cfg, res)["indexer_q"] == "e4m3" and run_record(scenario, tp1)["indexer_q"] == "bf16"


def test_check_command_with_e4m3_indexer_queries():
    proc = run_cli(["check", TINY, "parallel.tp=2", "parallel.launcher=local", "runtime.indexer_q=e4m3", *SCENARIO],
                   timeout_s=300)
    rec = last_json(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec["ok"] and rec["comparisons"]["vs_reference"]["tol"] == FP8_CACHE_TOLERANCES["float32"]
    assert rec["comparisons"]["vs_reference"]["max_rel_err"] < TOL  # no midpoint flip in this scenario


@pytest.mark.parametrize("tp", [2, 4])
def test_check_command_at_tp(tp):
    proc = run_cli(["check", TINY, f"parallel.tp={tp}", "parallel.launcher=local", *SCENARIO], timeout_s=300)
    rec = last_json(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec["ok"] and rec["tp"] == tp and rec["requests"] == 6
    assert set(rec["comparisons"]) >= {"tp_vs_tp1", "vs_reference", "incremental_vs_oneshot"}
    for c in rec["comparisons"].values():
        assert c["tol"] == TOL and 0 <= c["max_rel_err"] < TOL


def test_check_command_at_float64():
    """A float64 run computes in float64 throughout (rotary angles complex128, compressor state and softmaxes
    in float64, outputs kept float64): every comparison meets float64's own tolerance."""
    proc = run_cli(["check", TINY, "parallel.tp=2", "parallel.launcher=local", "runtime.dtype=float64", *SCENARIO],
                   timeout_s=300)
    rec = last_json(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec["ok"] and rec["dtype"] == "float64"
    for c in rec["comparisons"].values():
        assert c["tol"] == TOLERANCES["float64"] == 1e-9 and 0 <= c["max_rel_err"] <= 1e-9, rec["comparisons"]


def test_sink_changes_the_output(scenario, tp1):
    from tp_runtime.parallel.group import single_process
    from tp_runtime.engine.driver import drive
    from tp_runtime.verify.reference import reference_stack
    from tp_runtime.weights.fill import full_tensors
    from tp_runtime.executor.worker import Worker

    worker = Worker(scenario, single_process(torch.device("cpu")))
    for blk in worker.stack.layers.values():
        blk.attn.attn_sink.fill_(-1e30)  # exp(sink - m) = 0: the sink vanishes
    no_sink = drive(worker, keep_outputs=True).outputs
    assert max_rel_err(no_sink, tp1.outputs) > 1e-3  # the sink matters at the percent level
    # and the oracle, given the same weights, agrees with the sink-free run
    w = {k: v.double() for k, v in full_tensors(worker.stack).items()}
    wl = build_workload(scenario)
    for r in wl.requests:
        out = reference_stack(wl.request_inputs(r, torch.device("cpu"), torch.float64), w, scenario.model)
        assert max_rel_err({0: no_sink[r.id]}, {0: out}) < TOL


def test_too_long_request_is_rejected_and_others_unchanged(scenario, tp1):
    cfg = copy.deepcopy(scenario)
    cfg.workload.requests = 7
    cfg.workload.prompt_lens = scenario.workload.prompt_lens + [500]
    cfg.workload.decode_lens = scenario.workload.decode_lens + [20]  # 520 > max_len 512
    res = in_process(cfg, keep_outputs=True)
    assert len(res.rejected) == 1 and res.rejected[0].request == 6
    assert "request 6" in res.rejected[0].reason and "520" in res.rejected[0].reason and "512" in res.rejected[0].reason
    assert set(res.outputs) == set(range(6))
    assert max_rel_err(res.outputs, tp1.outputs) == 0.0  # same schedule for the others: bit-identical


@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_output_on_either_side_fails_the_comparison(side, bad):
    # Request 3, position 5 holds the bad value; request 1 is fine. max() over errors used to drop a NaN.
    torch.manual_seed(0)
    a = {1: torch.randn(4, 8), 3: torch.randn(9, 8)}
    b = {r: x.clone() for r, x in a.items()}
    (a, b)[side][3][5, 2] = bad
    c = compare(a, b, ("tp=2 ray", "tp=1"), TOL)
    assert c["ok"] is False and c["max_rel_err"] is None
    assert c["nonfinite"] == f"{('tp=2 ray', 'tp=1')[side]}: request 3 position 5"


def test_max_rel_err_propagates_nan():
    x = torch.zeros(3, 4)  # ||b|| = 0 and a - b = 0 give 0/1e-30 = 0; inf - inf gives NaN
    y = x.clone()
    x[1, 0] = y[1, 0] = float("inf")
    assert torch.isnan(torch.tensor(max_rel_err({0: x}, {0: y})))
    assert compare({0: torch.ones(2, 3)}, {0: torch.ones(2, 3)}, ("a", "b"), TOL) == {
        "max_rel_err": 0.0, "tol": TOL, "ok": True}
