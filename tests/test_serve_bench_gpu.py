"""serve-bench on one GPU: token times from CUDA events (no per-step synchronize), and under full_and_breakable
every decode-only step replays a full graph (none runs eagerly).

    pytest -m gpu tests/test_serve_bench_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import last_json, run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _settings(out) -> list[dict]:
    return [json.loads(line) for line in (out / "settings.jsonl").read_text().splitlines()]


def _check_latencies(s: dict) -> None:
    assert s["completed"] == s["requests"] and s["outputs_finite"] and s["same_requests_every_round"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        p50, p90, p99 = (s[f"{name}_ms_p{p}"] for p in (50, 90, 99))
        assert 0 < p50 <= p90 <= p99, (name, s)
    assert s["ttft_ms_p50"] <= s["e2el_ms_p50"] and s["output_throughput"] > 0


def test_tiny_full_and_breakable_on_one_gpu(tmp_path):
    """The tiny model (float32, capture sizes up to 64 = runtime.max_tokens_per_step): every step replays a
    graph, decode-only ones the full graph; closed loop and Poisson arrivals, two rounds."""
    r = run_cli(["serve-bench", "configs/serve_tiny.yaml", "runtime.device=cuda", "grid.modes=[full_and_breakable]",
                 "grid.concurrency=[1,4]", "grid.rate=[50.0]", "serve.repeats=2", f"serve.output={tmp_path}"],
                timeout_s=600)
    assert r.returncode == 0, r.stderr[-4000:]
    summ = last_json(r.stdout)
    assert summ["device"].startswith("cuda") and summ["timer"] == "cuda_events" and summ["all_completed"]
    settings = _settings(tmp_path / "serve_tiny")
    assert [s["label"] for s in settings] == ["c=1", "c=4", "rate=50/s"]
    for s in settings:
        _check_latencies(s)
        assert s["graph_captured"] and s["decode_steps"] > 0
        assert s["decode_eager_steps"] == 0, s["steps_by_path"]  # no decode step ran eagerly
        assert s["steps_by_path"].get("full") == s["decode_steps"] and "eager" not in s["steps_by_path"]
        assert s["max_running"] <= (s["concurrency"] or 4)


def test_flash_layers_modes_on_one_gpu(tmp_path):
    """Four Flash layers (window, window, CSA, HCA) in bf16 with the Triton kernels, the breakable scopes beside
    full_and_breakable at concurrency 1 and 16: every mode completes its requests with ordered latencies; the
    full mode's decode steps all replay full graphs."""
    r = run_cli(["serve-bench", "configs/serve_flash.yaml", "model.layers=0-3", "grid.concurrency=[1,16]",
                 "serve.requests=8", "serve.requests_per_client=1", "serve.repeats=1", "serve.warmup_requests=2",
                 "serve.output_len=[8,16]", f"serve.output={tmp_path}"], timeout_s=600)
    assert r.returncode == 0, r.stderr[-4000:]
    settings = _settings(tmp_path / "serve_flash")
    assert len(settings) == 2 * 4
    for s in settings:
        _check_latencies(s)
        assert s["graph_captured"] and s["kernels"] == "triton" and s["dtype"] == "bfloat16"
        if s["mode"] == "full_and_breakable":
            assert s["decode_eager_steps"] == 0 and s["steps_by_path"].get("full") == s["decode_steps"]
