"""Full-graph decode on a GPU: one CUDA graph per capture size holds every layer, replayed on any decode step.

Run on a machine with GPUs: `pytest -m gpu tests/test_full_graph_gpu.py` (two GPUs for the tp = 2 case).
The CPU twin (tests/test_full_decode.py) checks the same static path run eagerly against the dynamic one.
Stage B on two streams (runtime.streams=2, the default) against one, in full and breakable graphs: below.
"""

from __future__ import annotations


import pytest
import torch

from conftest import TINY_PATH as TINY, last_json, run_cli, with_settings
from test_full_decode import DECODES, EDGES
from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.verify.check import TOLERANCES, max_rel_err, reference_outputs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = TOLERANCES["float32"]  # tiny runs in float32: GEMMs of another row count may pick other kernels
GPU_EDGES = [e for e in EDGES if e != "runtime.device=cpu"] + ["runtime.device=cuda"]


@pytest.mark.parametrize("mode", ["full", "full_and_breakable"])
def test_replay_matches_eager_at_every_edge(mode):
    # Captured on an all-padding step (position 0, nothing in any cache), replayed at contexts 1..510.
    cfg = load_config(TINY, ["parallel.tp=1", f"graph.mode={mode}", "graph.capture_sizes=[8,4,2,1]", *GPU_EDGES])
    full = in_process(cfg, keep_outputs=True)
    # The same static path run eagerly (no capture size holds 8 tokens, no breakable graph to fall to).
    static = in_process(with_settings(cfg, "graph", mode="full", capture_sizes=[1]), keep_outputs=True)
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    assert full.steps_by_path["full"] == max(DECODES) == full.replays_by_size.get(8, 0)
    assert static.replayed_steps == 0 and static.steps_by_path["full"] == max(DECODES)
    replay_err = max_rel_err(full.outputs, static.outputs)
    print(f"full replay vs the same path eagerly: {replay_err:.3e}; vs dynamic eager: "
          f"{max_rel_err(full.outputs, eager.outputs):.3e}")
    assert replay_err <= TOL
    assert max_rel_err(full.outputs, eager.outputs) <= TOL
    assert max_rel_err(full.outputs, reference_outputs(cfg, list(full.outputs))) <= TOL
    assert full.graph["full"]["segments_per_step"] == 1 and full.graph["full"]["eager_breaks_per_step"] == 0
    # The one prefill step (1206 tokens) exceeds every capture size: it runs eagerly in both modes.
    assert full.steps_by_path == {"eager": 1, "full": max(DECODES)}
    if mode == "full_and_breakable":
        assert full.graph["breakable"]["eager_breaks_per_step"] == len(cfg.model.layer_ids())


def test_mixed_workload_replays_both_kinds():
    # Many requests, short prompts: prefill chunks and decodes mix, then decode-only steps follow.
    cfg = load_config(TINY, ["parallel.tp=1", "runtime.device=cuda", "graph.mode=full_and_breakable",
                             "graph.break_scope=narrow", "workload.requests=12", "workload.prompt_len=[3, 90]",
                             "workload.decode_len=[1, 40]", "runtime.max_seqs=12", "runtime.max_tokens_per_step=96",
                             "runtime.prefill_chunk=40"])
    run = in_process(cfg, keep_outputs=True)
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    paths = run.steps_by_path
    assert paths["full"] > 0 and paths["breakable"] > 0 and paths.get("eager", 0) > 0, paths
    assert max_rel_err(run.outputs, eager.outputs) <= TOL


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_check_full():
    proc = run_cli(["check", TINY, "parallel.tp=2", "parallel.launcher=local", "graph.mode=full_and_breakable",
                    *GPU_EDGES], timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = last_json(proc.stdout)
    assert rec["ok"] and "full_vs_eager" in rec["comparisons"] and rec["steps_by_path"]["full"] > 0


# ------------------------------------------------------------------ stage B on two streams (runtime.streams)


def _same_bits(a, b) -> bool:
    return a.outputs.keys() == b.outputs.keys() and all(torch.equal(a.outputs[k], b.outputs[k]) for k in a.outputs)


def test_side_stream_fork_and_join_inside_a_captured_graph():
    # The fork / branch / join of model/streams.py captured into one graph: the branch's kernels join the
    # capture, its allocation comes from the graph's pool, and a replay reads the inputs of the moment.
    from tp_runtime.model.streams import SideStream

    dev = torch.device("cuda")
    side, x = SideStream(dev), torch.randn(1 << 20, device=dev)

    def step() -> torch.Tensor:
        side.fork()
        with side.branch():
            y = x * 2  # side stream
        z = x + 1  # main stream, concurrently
        side.join()
        return y + z

    def want() -> torch.Tensor:  # the same ops on one stream: (2x) + (x + 1) rounds unlike 3x + 1
        return x * 2 + (x + 1)

    capture = torch.cuda.Stream(dev)
    capture.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(capture):
        assert torch.equal(step(), want())  # warm-up, eagerly on the capture stream
    torch.cuda.current_stream(dev).wait_stream(capture)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        out = step()
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize(dev)
    assert torch.equal(out, want())


@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_two_stream_full_graph_equals_one_stream_and_eager(kernels):
    # Replayed at contexts 1..510 (the edges above): two streams give the one-stream graph's outputs bit for
    # bit (the same kernels on the same shapes; only their streams differ), and the eager path's within TOL.
    cfg = load_config(TINY, ["parallel.tp=1", "graph.mode=full", "graph.capture_sizes=[8,4,2,1]",
                             f"runtime.kernels={kernels}", "runtime.streams=2", *GPU_EDGES])
    two = in_process(cfg, keep_outputs=True)
    one = in_process(with_settings(cfg, "runtime", streams=1), keep_outputs=True)
    eager_cfg = with_settings(with_settings(cfg, "runtime", streams=2), "graph", mode="eager")
    eager = in_process(eager_cfg, keep_outputs=True)
    assert two.steps_by_path["full"] == one.steps_by_path["full"] == max(DECODES) == two.replays_by_size.get(8, 0)
    assert _same_bits(two, one)
    assert max_rel_err(two.outputs, eager.outputs) <= TOL
    assert max_rel_err(two.outputs, reference_outputs(cfg, list(two.outputs))) <= TOL


@pytest.mark.parametrize("scope", ["wide", "hoisted", "narrow"])
def test_breakable_scopes_with_two_streams(scope):
    # Stage B runs on two streams inside the wide and hoisted breaks (eagerly, between segments); the narrow
    # scope keeps one. Every scope replays the one-stream outputs bit for bit and the eager ones within TOL.
    cfg = load_config(TINY, ["parallel.tp=1", "runtime.device=cuda", "graph.mode=breakable",
                             f"graph.break_scope={scope}", "runtime.streams=2", "workload.requests=6",
                             "workload.prompt_len=[3, 90]", "workload.decode_len=[1, 20]", "runtime.max_seqs=6"])
    two = in_process(cfg, keep_outputs=True)
    one = in_process(with_settings(cfg, "runtime", streams=1), keep_outputs=True)
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    assert two.steps_by_path.get("breakable", 0) > 0
    assert _same_bits(two, one)
    assert max_rel_err(two.outputs, eager.outputs) <= TOL


# ------------------------------------------------------------------ q_norm as the GEMMs' prologue (Triton GEMV)


def test_q_norm_in_the_gemv_prologue_matches_the_separate_norm(monkeypatch):
    # ops/gemv.py's tables name the shapes where its GEMV runs; put tiny's wq_b and indexer wq_b there at up to 8
    # rows, so every decode graph (capture sizes 8, 4, 2, 1) norms qr inside both GEMMs instead of writing it.
    from tp_runtime.ops import gemv as gemv_module
    from tp_runtime.ops import triton_path

    cfg = load_config(TINY, ["parallel.tp=1", "graph.mode=full", "graph.capture_sizes=[8,4,2,1]",
                             "runtime.kernels=triton", *GPU_EDGES])
    m = cfg.model
    plain = in_process(cfg, keep_outputs=True)
    shapes = {(m.num_attention_heads * m.head_dim, m.q_lora_rank): 8,
              (m.index_n_heads * m.index_head_dim, m.q_lora_rank): 8}
    monkeypatch.setattr(gemv_module, "TRITON_GEMV_NORM_MAX_M", shapes)
    normed_calls, real = [], triton_path.gemv

    def spy(x, weight, norm_weight=None, eps=0.0, **kw):
        normed_calls.append(norm_weight is not None)
        return real(x, weight, norm_weight, eps, **kw)

    monkeypatch.setattr(triton_path, "gemv", spy)
    fused = in_process(cfg, keep_outputs=True)
    assert any(normed_calls), "no GEMM took q_norm as its prologue"
    assert fused.steps_by_path == plain.steps_by_path
    # fp32: the prologue scales the fp32 product by rstd instead of rounding the normed row first
    assert max_rel_err(fused.outputs, plain.outputs) <= TOL
