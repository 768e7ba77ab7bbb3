"""User data: inputs from a safetensors file, outputs dumped to one; bad files refused before any rank runs."""

from __future__ import annotations

import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.verify.check import max_rel_err
from conftest import TINY_PATH as TINY, last_json, run_cli

BASE = ["parallel.tp=1", "workload.requests=3", "workload.prompt_lens=[7, 30, 21]",
        "workload.decode_lens=[2, 0, 5]"]


def test_dump_then_read_back_gives_the_same_outputs(tmp_path):
    dump = tmp_path / "run.safetensors"
    first = in_process(load_config(TINY, BASE + [f"workload.dump={dump}"]), keep_outputs=True)
    t = load_file(dump)
    assert t["prompt_len"].tolist() == [7, 30, 21]
    assert t["input.1"].shape == (30, 64) and t["output.2"].shape == (26, 64)
    assert torch.allclose(t["output.0"], first.outputs[0])
    # the dump is a valid input file: same inputs, same outputs
    again = in_process(load_config(TINY, ["parallel.tp=1", f"workload.inputs={dump}"]), keep_outputs=True)
    assert max_rel_err(again.outputs, first.outputs) == 0.0


def test_user_inputs_drive_the_run(tmp_path):
    f = tmp_path / "in.safetensors"
    torch.manual_seed(1)
    save_file({"input.0": torch.randn(12, 64), "input.1": torch.randn(40, 64, dtype=torch.bfloat16),
               "prompt_len": torch.tensor([10, 33])}, f)
    res = in_process(load_config(TINY, ["parallel.tp=1", f"workload.inputs={f}"]), keep_outputs=True)
    assert res.prefill_tokens == 43 and res.decode_tokens == 9 and set(res.outputs) == {0, 1}


@pytest.mark.parametrize("tensors,expect", [
    ({"input.0": torch.randn(5, 63), "prompt_len": torch.tensor([3])}, r"'input.0' has shape \[5, 63\], expected \[L, 64\]"),
    ({"input.0": torch.ones(5, 64, dtype=torch.int32), "prompt_len": torch.tensor([3])}, r"'input.0' has dtype torch.int32"),
    ({"input.0": torch.randn(5, 64)}, r"missing tensor 'prompt_len'"),
    ({"input.0": torch.randn(5, 64), "input.2": torch.randn(5, 64), "prompt_len": torch.tensor([3, 3])},
     r"missing \['input.1'\], unexpected \['input.2'\]"),
    ({"input.0": torch.randn(5, 64), "prompt_len": torch.tensor([9])}, r"prompt_len\[0\] = 9 must lie in \[1, 5\]"),
])
def test_bad_input_file_is_refused_before_launch(tmp_path, tensors, expect):
    import re

    f = tmp_path / "bad.safetensors"
    save_file(tensors, f)
    t0 = time.perf_counter()
    proc = run_cli(["run", TINY, "parallel.tp=2", f"workload.inputs={f}"], timeout_s=60)
    assert proc.returncode == 2
    assert re.search(expect, proc.stderr) and str(f) in proc.stderr, proc.stderr
    assert "tp_runtime run" not in proc.stdout  # no rank ran
    assert time.perf_counter() - t0 < 30


def test_run_json_has_the_documented_fields():
    proc = run_cli(["run", TINY, "parallel.tp=1", "parallel.launcher=local"], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    rec = last_json(proc.stdout)
    for key in ("command", "tp", "launcher", "device", "dtype", "graph_mode", "layers", "requests",
                "prefill_tokens", "decode_tokens", "steps", "wall_s", "decode_step_ms_median",
                "tokens_per_s", "output_checksum"):
        assert key in rec
    assert rec["requests"] == 8 and rec["layers"] == 6 and rec["output_checksum"] > 0
    assert rec["kernels_requested"] == "auto" and rec["kernels"] in ("torch", "triton")


def test_breakable_without_gpu_warns_and_runs_eagerly():
    proc = run_cli(["run", TINY, "parallel.tp=1", "parallel.launcher=local", "graph.mode=breakable",
                   "runtime.device=cpu"], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert "graph.mode=breakable needs a CUDA device" in proc.stderr
    rec = last_json(proc.stdout)
    assert rec["graph_mode"] == "eager" and rec["graph_mode_requested"] == "breakable"
    assert rec["replayed_fraction"] == 0.0
