"""User data: inputs from a safetensors file, outputs dumped to one; bad files refused before any rank runs."""

from __future__ import annotations

import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.report import report_and_status
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
    ({"input.0": torch.randn(5, 63), "prompt_len": torch.tensor([3])},
     r"'input.0' has shape \[5, 63\], expected \[L, 64\]"),
    ({"input.0": torch.ones(5, 64, dtype=torch.int32), "prompt_len": torch.tensor([3])},
     r"'input.0' has dtype torch.int32"),
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


# ---------------------------------------------------------------- outputs, and refusals as one line


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("dump,why", [("{f}/x.safetensors", "{f} is a file, not a directory"),
                                      ("{d}", "is a directory; it must name a file")])
def test_unwritable_dump_is_refused_before_any_rank_starts(tmp_path, dump, why):
    f = tmp_path / "a_file"
    f.write_text("")
    dump, why = dump.format(f=f, d=tmp_path), why.format(f=f)
    t0 = time.perf_counter()
    # The Ray launcher (tiny.yaml's): a started rank would print its placement line to stderr.
    proc = run_cli(["run", TINY, f"workload.dump={dump}"], timeout_s=60)
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error_line(proc)
    assert line.startswith(f"error: workload.dump={dump}") and why in line, line
    assert time.perf_counter() - t0 < 30  # the refusal is the CLI's start-up (~2 s); a launch takes longer


def test_dump_that_fails_at_the_end_keeps_the_report(tmp_path, capsys):
    # The path was fine when checked and is not when written (here: never checked, as a worker sees it).
    blocker = tmp_path / "gone"
    blocker.write_text("")
    cfg = load_config(TINY, BASE + [f"workload.dump={blocker}/run.safetensors"])
    res = in_process(cfg)
    assert res.completed == 3 and len(res.errors) == 1
    assert res.errors[0].startswith(f"workload.dump={blocker}/run.safetensors: writing the dump failed: ")
    assert report_and_status(cfg, res) == 1  # what `run` (and torchrun's rank 0) prints and returns
    out, err = capsys.readouterr()
    assert last_json(out)["completed"] == 3  # the report and its JSON line first
    assert err.strip().splitlines() == [f"error: {res.errors[0]}"]


def test_run_where_every_request_is_rejected_exits_non_zero():
    proc = run_cli(["run", TINY, "parallel.tp=1", "parallel.launcher=local", "runtime.max_len=8",
                    "workload.requests=2", "workload.prompt_lens=[9, 12]", "workload.decode_lens=[0, 1]"],
                   timeout_s=120)
    rec = last_json(proc.stdout)  # the report comes first
    assert proc.returncode == 1 and rec["completed"] == 0 and len(rec["rejected"]) == 2
    assert _one_error_line(proc) == "error: no request completed: all 2 were rejected"


@pytest.mark.parametrize("case", ["list yaml", "directory", "write-checkpoint into a file", "cuda at tp 1"])
def test_bad_arguments_print_one_error_line_and_exit_2(tmp_path, case):
    listed = tmp_path / "list.yaml"
    listed.write_text("- model\n- parallel\n")
    a_file = tmp_path / "ckpt"
    a_file.write_text("")
    args, words = {
        "list yaml": (["run", str(listed), "parallel.tp=1"], [str(listed), "top level must be a mapping"]),
        "directory": (["run", str(tmp_path)], [str(tmp_path), "is a directory"]),
        "write-checkpoint into a file": (["write-checkpoint", TINY, str(a_file)],
                                         [f"write-checkpoint OUT_DIR={a_file} is a file"]),
        "cuda at tp 1": (["run", TINY, "runtime.device=cuda", "parallel.tp=1", "parallel.launcher=local"],
                         ["override 'runtime.device=cuda'", "CUDA is not available"]),
    }[case]
    if case == "cuda at tp 1" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run_cli(args, timeout_s=60)
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error_line(proc)
    assert all(w in line for w in words), line


def test_a_fifo_as_inputs_is_refused_without_being_opened(tmp_path):
    # Opening a FIFO for reading blocks until a writer comes: it is refused up front instead, in one line.
    import os

    from conftest import assert_refused

    fifo = tmp_path / "inputs.safetensors"
    os.mkfifo(fifo)
    proc = run_cli(["run", TINY, "parallel.launcher=local", f"workload.inputs={fifo}"], timeout_s=60)
    line = assert_refused(proc, "workload.inputs", fifo)
    assert "a FIFO, not a regular file" in line


@pytest.mark.parametrize("words", [["workload.requests=3"], ["workload.prompt_lens=[4, 5]"],
                                   ["workload.prompt_len=[4, 8]"], ["workload.decode_lens=[1, 1]"]])
def test_drawn_workload_keys_beside_inputs_are_refused(tmp_path, words):
    """The inputs file sets the requests and lengths; one given on the command line beside it would be ignored."""
    from tp_runtime.config import ConfigError

    f = tmp_path / "in.safetensors"
    with pytest.raises(ConfigError, match=rf"'{words[0].split('=')[0]}' and 'workload.inputs' are both given"):
        load_config(TINY, [f"workload.inputs={f}", *words])


def test_drawn_workload_keys_in_the_file_that_sets_inputs_are_refused(tmp_path):
    from tp_runtime.config import ConfigError

    cfg = tmp_path / "run.yaml"
    text = open(TINY).read()
    cfg.write_text(text.replace("\nworkload:\n", f"\nworkload:\n  inputs: {tmp_path / 'in.safetensors'}\n", 1))
    with pytest.raises(ConfigError, match=rf"{cfg}: 'workload.requests' and 'workload.inputs' are both given"):
        load_config(cfg)


def test_float8_input_rows_are_read_and_checked(tmp_path):
    from tp_runtime.engine.workload import InputError, read_inputs

    rows = torch.randn(6, 64).to(torch.float8_e4m3fn)
    f = tmp_path / "f8.safetensors"
    save_file({"input.0": rows, "prompt_len": torch.tensor([4])}, f)
    requests, inputs = read_inputs(str(f), 64)
    assert requests[0].prompt_len == 4 and torch.equal(inputs[0], rows.float())
    rows[2, 3] = float("nan")
    save_file({"input.0": rows, "prompt_len": torch.tensor([4])}, f)
    with pytest.raises(InputError, match="'input.0' holds NaN"):
        read_inputs(str(f), 64)
