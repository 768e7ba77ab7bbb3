"""Capture sizes per graph kind (CPU): graph.breakable_capture_sizes validated by name, the sizes each kind is
captured at, the size a step replays at, the buffers and memory they need, and a CPU run with them.

GPU replay of large breakable sizes (no eager step, mixed steps against eager, capture memory):
tests/test_prefill_graphs_gpu.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ROOT, TINY, TINY_PATH, assert_refused, last_json, run_cli
from tp_runtime.bench.sweep_config import load_sweep
from tp_runtime.config import ConfigError, breakable_sizes, eager_steps_warning, load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.shard import ModelShard
from tp_runtime.executor.step_graphs import StepGraphs
from tp_runtime.memory_model import buffer_capacity, rank_memory, workspace_bytes
from tp_runtime.parallel.group import single_process

FLASH, PRO = ROOT / "configs" / "v4_flash.yaml", ROOT / "configs" / "v4_pro.yaml"


# ------------------------------------------------------------------ validation


def test_breakable_sizes_are_accepted_and_default_to_none():
    assert load_config(TINY_PATH).graph.breakable_capture_sizes == []
    cfg = load_config(TINY_PATH, ["graph.breakable_capture_sizes=[48, 16, 64]"])
    assert cfg.graph.breakable_capture_sizes == [48, 16, 64]


@pytest.mark.parametrize("value,needle", [
    ("[0, 8]", r"must hold positive token counts, got \[0\]"),
    ("[-4]", r"must hold positive token counts, got \[-4\]"),
    ("[32, 8, 32]", r"lists \[32\] more than once"),
    ("[1.5]", r"'graph\.breakable_capture_sizes\[0\]' must be int, got float"),
    ("32", r"'graph\.breakable_capture_sizes' must be a list of int"),
])
def test_bad_breakable_sizes_are_refused_naming_key_and_word(value, needle):
    word = f"graph.breakable_capture_sizes={value}"
    with pytest.raises(ConfigError, match=needle) as e:
        load_config(TINY_PATH, [word])
    assert f"override '{word}'" in str(e.value) and "graph.breakable_capture_sizes" in str(e.value)


def test_bad_breakable_sizes_in_a_file_name_the_file(tmp_path):
    p = tmp_path / "dup.yaml"
    text = Path(TINY_PATH).read_text()
    p.write_text(text.replace("  capture_sizes: [", "  breakable_capture_sizes: [64, 64]\n  capture_sizes: ["))
    with pytest.raises(ConfigError, match=rf"^{p}: 'graph\.breakable_capture_sizes' lists \[64\] more than once"):
        load_config(p)


def test_cli_refuses_bad_sizes_with_one_error_line():
    r = run_cli(["run", TINY, "graph.breakable_capture_sizes=[0]"], timeout_s=120)
    assert_refused(r, "graph.breakable_capture_sizes", "positive")


# ------------------------------------------------------------------ sizes per kind


def test_breakable_kind_takes_both_lists_and_drops_sizes_above_the_step_budget():
    cfg = load_config(TINY_PATH, ["graph.capture_sizes=[8, 4, 1]", "runtime.max_tokens_per_step=100",
                                  "graph.breakable_capture_sizes=[16, 128, 96, 8, 101]"])
    # 128 and 101 exceed max_tokens_per_step: no step holds them; 8 is in both lists and captured once.
    assert breakable_sizes(cfg) == [96, 16, 8, 4, 1]
    assert cfg.graph.capture_sizes == [8, 4, 1]  # full graphs keep the decode sizes alone


@pytest.mark.parametrize("path", [FLASH, PRO])
def test_released_configs_capture_breakable_graphs_up_to_the_step_budget(path):
    cfg = load_config(path)
    rt, sizes = cfg.runtime, breakable_sizes(cfg)
    assert cfg.graph.mode == "full_and_breakable"
    assert max(sizes) == rt.max_tokens_per_step and max(cfg.graph.capture_sizes) < rt.prefill_chunk
    assert eager_steps_warning(cfg) is None
    # A smaller step budget drops the larger sizes instead of refusing the config (the GPU checks lower it).
    low = load_config(path, ["runtime.max_tokens_per_step=256"])
    assert max(breakable_sizes(low)) == 256 and eager_steps_warning(low) is None


def _mixed(decodes: int, chunk: int) -> StepPlan:
    """`decodes` sequences' decode tokens, then one prefill chunk of `chunk` tokens (a new sequence)."""
    chunks = [SeqChunk(r, r, 40 + r, 1, True) for r in range(decodes)]
    return StepPlan((*chunks, SeqChunk(decodes, decodes, 0, chunk, False)))


def test_size_for_picks_the_smallest_breakable_size_holding_a_mixed_step():
    cfg = load_config(FLASH)
    sizes = breakable_sizes(cfg)
    graphs = StepGraphs(sizes, torch.device("cpu"), full=False, pool="not captured on a cpu")
    for decodes, chunk in [(8, 56), (8, 57), (3, 94), (64, 129), (64, 256), (7, 505), (0, 512)]:
        n = _mixed(decodes, chunk).n_tokens
        want = min(s for s in sizes if s >= n)
        assert graphs.size_for(n) == want, (decodes, chunk, n)
    assert [graphs.size_for(n) for n in (64, 65, 96, 97, 193, 385)] == [64, 96, 96, 128, 256, 512]
    assert graphs.size_for(cfg.runtime.max_tokens_per_step + 1) is None  # larger: the step runs eagerly
    full = StepGraphs(cfg.graph.capture_sizes, torch.device("cpu"), full=True, pool="unused")
    assert full.size_for(65) is None  # a full graph never serves a prefill-sized step


def test_buffers_and_workspace_cover_the_largest_breakable_size():
    cfg = load_config(TINY_PATH, ["graph.mode=breakable", "runtime.max_tokens_per_step=200",
                                  "graph.breakable_capture_sizes=[256, 192, 128]"])
    assert breakable_sizes(cfg)[0] == 192 and buffer_capacity(cfg, oneshot=False) == 200
    cfg = load_config(TINY_PATH, ["graph.mode=breakable", "graph.breakable_capture_sizes=[64]",
                                  "graph.capture_sizes=[80, 8]"])  # a decode size above the step budget
    assert buffer_capacity(cfg, oneshot=False) == 80
    # Flash: every breakable size fits the step budget, so the workspace is the budget's, graphs or not.
    flash = load_config(FLASH)
    m, r = flash.model, flash.runtime
    assert rank_memory(flash, "cuda")["workspace"] == workspace_bytes(m, 1, r.max_tokens_per_step, r.max_len, 2)


@pytest.mark.parametrize("mode", ["eager", "breakable", "full"])
def test_memory_fit_counts_the_buffer_rows_the_shard_allocates(mode):
    # A decode size above the step budget: the shard allocates rows for it in every mode (Workers of several
    # modes may share one shard), and the memory check counts the workspace at those rows.
    cfg = load_config(TINY_PATH, [f"graph.mode={mode}", "graph.capture_sizes=[80, 8]", "parallel.tp=1"])
    shard = ModelShard.build(cfg, single_process(torch.device("cpu")))
    assert shard.buffers.capacity == buffer_capacity(cfg) == 80
    m, r = cfg.model, cfg.runtime
    assert rank_memory(cfg, "cpu")["workspace"] == workspace_bytes(m, 1, shard.buffers.capacity, r.max_len, 4)


def test_the_bench_captures_its_batches_only():
    sweep = load_sweep(ROOT / "configs" / "bench_scaling.yaml")
    assert load_config(FLASH).graph.breakable_capture_sizes  # the base has prefill sizes ...
    cfg = sweep.worker_config(1, sweep.variants()[0], "full_and_breakable")
    assert cfg.graph.breakable_capture_sizes == [] and breakable_sizes(cfg) == [128, 32, 8, 1]  # ... not used


# ------------------------------------------------------------------ the warning and a CPU run


def test_warning_names_the_keys_and_the_eager_step_range():
    cfg = load_config(TINY_PATH, ["graph.mode=full_and_breakable", "runtime.max_tokens_per_step=96"])
    note = eager_steps_warning(cfg)
    assert note.startswith(f"{TINY_PATH} and override 'runtime.max_tokens_per_step=96': ")
    assert "steps of 65-96 tokens run eagerly" in note and "graph.breakable_capture_sizes" in note
    covered = load_config(TINY_PATH, ["graph.mode=breakable", "runtime.max_tokens_per_step=96",
                                      "graph.breakable_capture_sizes=[96]"])
    assert eager_steps_warning(covered) is None
    for mode in ("eager", "full"):  # no breakable graph: nothing is said
        assert eager_steps_warning(load_config(TINY_PATH, [f"graph.mode={mode}", "runtime.max_tokens_per_step=96"])) \
            is None


RUN = ["parallel.tp=1", "parallel.launcher=local", "runtime.device=cpu", "workload.requests=3",
       "workload.prompt_len=[20, 120]", "workload.decode_len=[2, 5]", "runtime.max_tokens_per_step=96",
       "runtime.prefill_chunk=80"]


def test_cpu_run_with_breakable_sizes_runs_eagerly_and_reports():
    # One CLI run: the warning line before the run (sizes stop at 64 < 96), then the report.
    proc = run_cli(["run", TINY, *RUN, "graph.mode=breakable", "graph.breakable_capture_sizes=[48]"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and "steps of 65-96 tokens run eagerly" in warned[0], proc.stderr[-3000:]
    rec = last_json(proc.stdout)
    assert rec["graphs"] == {} and rec["eager_steps"] == rec["steps"] > 0
    assert rec["steps_by_path"] == {"eager": rec["steps"]} and rec["completed"] == 3
    # On a CPU the breakable path is the eager one: the same outputs as graph.mode=eager.
    eager = in_process(load_config(TINY_PATH, RUN))
    assert rec["output_checksum"] == eager.output_checksum


def test_report_states_each_kinds_sizes_and_costs(capsys):
    from tp_runtime.engine.driver import RunResult
    from tp_runtime.engine.report import print_report

    cfg = load_config(FLASH, ["model.layers=0-1"])
    kinds = {"full": cfg.graph.capture_sizes, "breakable": breakable_sizes(cfg)}
    graph = {kind: {"capture_sizes": sizes, "capture_s": 1.5, "segments_per_step": 3, "eager_breaks_per_step": 2,
                    "graph_pool_bytes": 3 << 20, "warmup_bytes": 2 << 20, "capture_peak_bytes": 3 << 20}
             for kind, sizes in kinds.items()}
    res = RunResult(steps=5, replayed_steps=5, steps_by_path={"full": 2, "breakable": 3}, wall_s=1.0, graph=graph,
                    completed=1, device="cuda:0", dtype="bfloat16")
    rec = print_report(cfg, res)
    out = capsys.readouterr().out
    assert "  full graphs, 7 sizes (64 ... 1 tokens): 3 segments" in out
    assert "  breakable graphs, 13 sizes (512 ... 1 tokens): 3 segments + 2 eager breaks per step, capture 1.50 s, " \
           "pool 3.0 MiB" in out
    assert rec["graphs"]["breakable"]["capture_sizes"] == breakable_sizes(cfg) and rec["eager_steps"] == 0
    assert rec["capture_sizes"] == breakable_sizes(cfg) and rec["graph_pool_bytes"] == 2 * (3 << 20)
