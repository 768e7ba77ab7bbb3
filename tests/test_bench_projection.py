"""Projected points (`grid.shard_of_tp`) and figures that cannot be impossible: the setting's validation and
its refusal on a CPU, the projection's arithmetic on synthetic records, projected rows kept apart from
measured ones in tables, summaries and plots, a rank's shard run alone through the real bench loop (CPU),
the roofline-below-1 flag, the warmed-up all-reduce median; the tiny projected sweep on a GPU (`gpu`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tp_runtime.bench.entry import bench_entry
from tp_runtime.bench.lane_record import roofline
from tp_runtime.bench.measure import allreduce_ms
from tp_runtime.bench.plots import write_plots
from tp_runtime.bench.projection import add_speedups, rank_fields, shard_group
from tp_runtime.bench.record import Point
from tp_runtime.bench.report import print_tables, read_jsonl, split_records, summary
from tp_runtime.bench.sweep import launch_plan
from tp_runtime.bench.sweep_config import load_sweep
from tp_runtime.cli import main as cli_main
from tp_runtime.config import ConfigError, load_config
from tp_runtime.executor.worker import Worker
from tp_runtime.parallel.allreduce import AllReduce
from tp_runtime.parallel.group import TPGroup, single_process

ROOT = Path(__file__).resolve().parents[1]
TINY_SWEEP = ROOT / "configs" / "bench_tiny.yaml"
TP1 = "grid.parallel.tp=[1]"
NO_CUDA = not torch.cuda.is_available()


# ------------------------------------------------------------------ the setting: validated, refused on a CPU


@pytest.mark.parametrize("words, needle", [
    (["grid.shard_of_tp=[0, 2]"], "grid 'shard_of_tp' holds [0]"),
    (["grid.shard_of_tp=[1, two]"], "grid 'shard_of_tp' holds ['two']"),
    (["grid.shard_of_tp=[2, 2]"], "values must be distinct positive integers"),
    (["grid.shard_of_tp=[1, 3]"], "grid 'shard_of_tp' holds [3]: each value must divide num_attention_heads=8 "
                                  "and o_groups=4"),
    (["grid.shard_of_tp=[1, 8]"], "grid 'shard_of_tp' holds [8]"),  # 8 divides the heads, not the 4 groups
    (["grid.shard_of_tp=4"], "grid 'shard_of_tp' must be a non-empty list"),
    (["grid.shard_of_tp=[2, 4]", "bench.shard_rank=2"], "'bench.shard_rank'=2 must be a rank of every grid "
                                                        "'shard_of_tp' value: 0..1"),
    (["grid.shard_of_tp=[1, 2]", "bench.projected_allreduce_us=-1"], "'bench.projected_allreduce_us' must be"),
    (["grid.shard_of_tp=[1, 2]", "bench.projected_allreduce_us=.inf"], "'bench.projected_allreduce_us' must be"),
    (["grid.shard_of_tp=[1, 2]", "grid.parallel.tp=[1, 2]"], "parallel.tp must be 1, got [1, 2]"),
    (["grid.shard_of_tp=[1, 2]", "grid.modes=[eager, eager@nccl]"], "grid 'modes' holds ['eager@nccl']"),
])
def test_bad_shard_of_tp_settings_are_refused_by_key(words, needle):
    # Value checks come before the device check, so every one of these is refused for its own reason here.
    overrides = words if any(w.startswith("grid.parallel.tp") for w in words) else [TP1, *words]
    with pytest.raises(ConfigError) as e:
        load_sweep(TINY_SWEEP, overrides)
    assert needle in str(e.value)


@pytest.mark.skipif(not NO_CUDA, reason="the refusal on a machine without CUDA")
@pytest.mark.parametrize("device, why", [("cpu", "runtime.device=cpu"),
                                         ("auto", "CUDA is not available on this machine")])
def test_shard_of_tp_is_refused_on_a_cpu_before_anything_starts(tmp_path, capsys, device, why):
    rc = cli_main(["bench", str(TINY_SWEEP), TP1, "grid.shard_of_tp=[1,2]", f"runtime.device={device}",
                   f"bench.output={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    assert "grid 'shard_of_tp' projects GPU ranks and needs a CUDA device" in lines[0] and why in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_the_committed_projection_sweep_is_the_h200_grid():
    """configs/bench_shard_tp.yaml: 43 Flash layers, full graph, Triton, batch {1, 32} x context {4K, 32K}.
    Read as a file here (Triton and CUDA are refused on this machine by the loader, rightly)."""
    import yaml

    data = yaml.safe_load((ROOT / "configs" / "bench_shard_tp.yaml").read_text())
    g, b = data["grid"], data["bench"]
    assert g["shard_of_tp"] == [1, 2, 4, 8] and g["parallel.tp"] == [1]
    assert g["modes"] == ["full@pdl_off+streams1", "full"]
    assert g["bench.batch"] == [1, 32] and g["bench.context"] == [4096, 32768] and g["model.num_hidden_layers"] == [43]
    assert "runtime.kernels=triton" in data["overrides"] and "runtime.dtype=bfloat16" in data["overrides"]
    assert b["projected_allreduce_us"] == 5.0 and b["shard_rank"] == 0 and b["profile_steps"] > 0
    flash = load_config(ROOT / "configs" / "v4_flash.yaml").model
    assert all(flash.num_attention_heads % k == 0 and flash.o_groups % k == 0 for k in g["shard_of_tp"])


# ------------------------------------------------------------------ the arithmetic, on synthetic records


def _projected(k: int, step_ms: float, roof_ms: float, mode: str = "full", batch: int = 1, layers: int = 43,
               us: float = 5.0) -> dict:
    return {"kind": "point", "name": "s", "variant": "base", "mode": mode, "batch": batch, "context": 4096,
            "cache_fill": "seeded", "tp": 1, "shard_of_tp": k, "shard_rank": 0,
            **rank_fields(step_ms, roof_ms, layers, k, us)}


def test_projected_step_and_speedup_by_hand():
    # 43 layers x 5 us = 0.215 ms of all-reduce at k > 1, none at k = 1.
    recs = [_projected(1, 4.91, 2.29), _projected(8, 3.41, 0.58), _projected(8, 7.0, 1.0, batch=32)]
    add_speedups(recs)
    one, eight, no_base = recs
    assert one["projected_comm_ms"] == 0.0 and one["projected_step_ms"] == 4.91 and one["projected_speedup"] == 1.0
    assert eight["projected_comm_ms"] == pytest.approx(0.215)
    assert eight["projected_step_ms"] == pytest.approx(3.625)
    assert eight["projected_speedup"] == pytest.approx(4.91 / 3.625)  # 1.354: the figure a tp-8 rank projects
    assert eight["projected_roofline_ms"] == pytest.approx(0.795)
    assert eight["projected_roofline_speedup"] == pytest.approx(2.29 / 0.795)
    assert eight["rank_roofline_ratio"] == pytest.approx(3.41 / 0.58) and eight["projected"] is True
    assert no_base["projected_speedup"] is None  # batch 32 has no shard_of_tp = 1 twin in this sweep
    # Another all-reduce latency changes the projection, not the measurement.
    ten = _projected(8, 3.41, 0.58, us=10.0)
    assert ten["rank_step_ms"] == 3.41 and ten["projected_step_ms"] == pytest.approx(3.41 + 0.43)


def _measured(tp: int, ratio: float = 2.0, mode: str = "full") -> dict:
    return {"kind": "point", "name": "s", "variant": "base", "mode": mode, "batch": 1, "context": 4096,
            "cache_fill": "seeded", "tp": tp, "step_ms_median": ratio, "step_ms_p90": ratio,
            "decode_tokens_per_s": 1.0, "break_fraction": 0.0, "break_host_fraction": 0.0,
            "prefill_tokens_per_s": None, "allreduce_ms_eager": 0.0, "allreduce_ms_graph": 0.0,
            "roofline_model_ms": 1.0, "roofline_ratio": ratio, "roofline_ratio_below_1": ratio < 1,
            "outputs_finite": True, "timer": "cuda_events", "device": "cuda:0", "launcher": "local"}


def test_projected_rows_stay_out_of_measured_tables_summaries_and_plots(tmp_path, capsys):
    proj = add_speedups([{**_projected(k, 5.0 / k ** 0.5, 2.0 / k), "roofline_ratio": 2.0, "outputs_finite": True,
                          "timer": "cuda_events", "device": "cuda:0", "launcher": "local"} for k in (1, 2, 4, 8)])
    measured = [_measured(1, 2.5), _measured(2, 0.6)]  # the second beat its roofline: flagged
    comps = [{"kind": "comparison", "what": "tp_vs_tp1", "variant_mode": "full", "baseline": "tp1:full", "tp": 2,
              "batch": 1, "context": 4096, "variant": "base", "speedup": 1.5, "speedup_q1": 1.4, "speedup_q3": 1.6,
              "speedup_min": 1.3, "speedup_max": 1.7},
             {"kind": "comparison", "what": "graphs_vs_eager", "variant_mode": "full", "baseline": "eager", "tp": 1,
              "batch": 1, "context": 4096, "variant": "base", "speedup": 3.0, "speedup_q1": 3.0, "speedup_q3": 3.0,
              "speedup_min": 3.0, "speedup_max": 3.0, "projected": True, "shard_of_tp": 4}]
    print_tables(measured + proj, comps)
    out = capsys.readouterr().out
    measured_part, projected_part = out.split("PROJECTED, not measured tp", 1)
    # The measured table holds its two rows only; no projected field appears in it.
    rows = [line for line in measured_part.splitlines() if line.startswith("base ")]
    assert len(rows) == 2 and "tp_vs_tp1" in measured_part and "graphs_vs_eager" not in measured_part
    assert rows[0].split()[-1] == "2.5" and rows[1].split()[-1] == "!<1"  # flagged, not printed as a ratio
    proj_rows = [line for line in projected_part.splitlines() if line.startswith("base ")]
    assert [int(r.split()[1]) for r in proj_rows[:4]] == [1, 2, 4, 8]
    assert proj_rows[3].split()[-2] == f"{proj[3]['projected_speedup']:.2f}"
    assert "PROJECTED shards' speedups" in projected_part and "graphs_vs_eager" in projected_part
    assert "roofline_ratio_below_1: true" in out  # the flag's note
    summ = summary("s", "c.yaml", [], measured + proj, comps, tmp_path, [], 1.0)
    assert summ["points"] == 2 and summ["projected_points"] == 4 and summ["tp"] == [1, 2]
    assert summ["roofline_ratio_median"] == 2.5 and summ["roofline_ratio_below_1"] == 1
    assert summ["speedups"] == {"tp_vs_tp1:full:tp2": 1.5, "projected:graphs_vs_eager:full:shard_tp4": 3.0}
    assert summ["projected_speedups"]["full:tp8:b1:ctx4096"] == pytest.approx(proj[3]["projected_speedup"])
    assert write_plots(proj, comps, tmp_path) == ["projected_speedup_vs_tp.png"]  # no measured plot from them


# ------------------------------------------------------------------ the loop, for real, on a CPU


def test_a_rank_shard_runs_alone_through_the_bench_loop(tmp_path):
    """A tp 1 sweep given shard_of_tp after loading (the loader refuses it on a CPU): every shard's Worker
    builds on a group without a process group, steps with its all-reduce left out, and records the projection."""
    sweep = load_sweep(TINY_SWEEP, [TP1, "grid.bench.batch=[2]", "grid.bench.context=[20]", "bench.repeats=1",
                                    "bench.prefill_check=false", "bench.prefill_steps=0", f"bench.output={tmp_path}"])
    sweep.grid["shard_of_tp"] = [4, 1, 2]
    (cfg, bench_dict), = launch_plan(sweep)
    assert [g["shard_of_tp"] for g in bench_dict["groups"]] == [1, 2, 4]  # tp 1 first
    points, comps = split_records(bench_entry(cfg.to_dict(), bench_dict))
    assert comps == [] and [p["shard_of_tp"] for p in points] == [1, 2, 4]
    by = {p["shard_of_tp"]: p for p in points}
    for k, p in by.items():
        assert p["projected"] and p["tp"] == 1 and p["shard_rank"] == 0 and p["outputs_finite"]
        assert p["allreduce_path"] == "none" and p["roofline_comm_ms"] == 0.0
        if k > 1:  # (tp 1 has no all-reduce to leave out)
            assert p["allreduce_ms_eager"] is None and "left out" in p["allreduce_ms_path"]
        assert p["rank_step_ms"] == p["step_ms_median"] and p["rank_roofline_ms"] == p["roofline_model_ms"]
        assert p["projected_step_ms"] == pytest.approx(p["rank_step_ms"] + (6 * 5e-3 if k > 1 else 0.0))
        assert p["projected_speedup"] == pytest.approx(by[1]["projected_step_ms"] / p["projected_step_ms"])
    # A rank of tp k holds fewer weight bytes (its heads and groups), the same caches (replicated).
    assert by[1]["roofline_weight_bytes"] > by[2]["roofline_weight_bytes"] > by[4]["roofline_weight_bytes"]
    assert by[1]["roofline_cache_bytes"] == by[4]["roofline_cache_bytes"]
    assert by[2]["weight_bytes_per_rank"] == by[2]["roofline_weight_bytes"]


def test_roofline_fields_flag_a_ratio_below_1():
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ["runtime.max_seqs=2", "runtime.max_len=64"])
    w = Worker(cfg, single_process(torch.device("cpu")))
    machine = {"copy_GBps": 1.0, "read_GBps": 0.5, "roofline_GBps": 1.0, "roofline_bandwidth": "copy",
               "copy_bytes": 2**20, "copy_method": "m"}
    point, ar = Point(batch=1, context=20, variant="base"), {"allreduce_ms_graph": None, "allreduce_ms_eager": 0.0}
    f = roofline(machine, w, point, ar, step_ms=1e3, tp=1, projected_allreduce_us=5.0).to_json()
    model_ms = f["roofline_bytes"] / 1e9 * 1e3  # bytes over 1 GB/s
    assert f["roofline_model_ms"] == pytest.approx(model_ms) and not f["roofline_ratio_below_1"]
    fast = roofline(machine, w, point, ar, step_ms=model_ms / 2, tp=1, projected_allreduce_us=5.0).to_json()
    assert fast["roofline_ratio"] == pytest.approx(0.5) and fast["roofline_ratio_below_1"] is True
    assert "projected" not in f and f["copy_bytes"] == 2**20


# ------------------------------------------------------------------ the all-reduce latency: warmed up, a median


@dataclass(eq=False)
class _ColdStart(AllReduce):
    """An all-reduce whose first `cold` calls take 50 ms (connection set-up), the rest none."""

    cold: int = 0
    calls: int = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= self.cold:
            time.sleep(0.05)
        return x


def test_allreduce_latency_is_warmed_up_and_a_median():
    # 12 slow calls: all absorbed by the 20 untimed ones. Then 3 slow calls among 7 timed ones: the median
    # stays with the fast ones, where a mean would not.
    ar = _ColdStart("nccl", "none", "test", world=2, cold=12)
    group = TPGroup(rank=0, size=2, device=torch.device("cpu"), allreduce=ar)
    t = allreduce_ms(group, (1, 8), torch.float32, iters=5)
    assert ar.calls == 25 and t["allreduce_ms_eager"] < 5.0, t
    assert "after a barrier and 20 untimed" in t["allreduce_method"]
    ar = _ColdStart("nccl", "none", "test", world=2, cold=3)
    t = allreduce_ms(group.__class__(0, 2, torch.device("cpu"), allreduce=ar), (8,), torch.float32, iters=7, warmup=0)
    assert t["allreduce_ms_eager"] < 5.0, t


def test_shard_group_reduces_nothing_and_shards_as_its_rank():
    g = shard_group(3, 4, torch.device("cpu"), "auto")
    x = torch.ones(2, 3)
    assert g.all_reduce(x) is x and bool((x == 1).all()) and not g.has_peers
    assert g.shard(64, "heads") == (48, 64) and g.allreduce.describe()["allreduce_path"] == "none"


# ------------------------------------------------------------------ GPU (pytest -m gpu)


@pytest.mark.gpu
def test_gpu_tiny_projected_sweep(tmp_path, capsys):
    """shard_of_tp [1, 2] of the tiny model in one process: full graphs replay, records carry the projection,
    the PROJECTED table and plot are written and no measured one."""
    rc = cli_main(["bench", str(TINY_SWEEP), "runtime.device=cuda", TP1, "grid.shard_of_tp=[1,2]",
                   "grid.modes=[full]", "grid.bench.batch=[1,4]", "grid.bench.context=[12,150]",
                   "bench.prefill_check=false", f"bench.output={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 0
    summ = json.loads(out.strip().splitlines()[-1])
    assert summ["points"] == 0 and summ["projected_points"] == 8 and summ["shard_of_tp"] == [1, 2]
    assert "PROJECTED, not measured tp" in out and summ["files"][-1] == "projected_speedup_vs_tp.png"
    points = read_jsonl(tmp_path / "tiny" / "points.jsonl")
    by = {(p["shard_of_tp"], p["batch"], p["context"]): p for p in points}
    assert len(by) == 8
    for (k, b, c), p in by.items():
        assert p["projected"] and p["tp"] == 1 and p["timer"] == "cuda_events" and p["outputs_finite"]
        assert p["graph_captured"] and p["replayed_fraction"] == 1.0 and (p["allreduce_ms_eager"] is None) == (k > 1)
        assert p["kernels_per_step"] > p["layers"] and p["gpu_ms_by_kernel"][0]["ms"] > 0
        assert p["rank_roofline_ms"] > 0 and p["rank_roofline_ratio"] == pytest.approx(p["rank_step_ms"]
                                                                                       / p["rank_roofline_ms"])
        assert p["projected_step_ms"] == pytest.approx(p["rank_step_ms"] + (6 * 5e-3 if k > 1 else 0.0))
        assert p["projected_speedup"] == pytest.approx(by[(1, b, c)]["projected_step_ms"] / p["projected_step_ms"])
        assert p["copy_bytes"] >= 2**30 and p["roofline_weight_bytes"] == p["weight_bytes_per_rank"]
    assert by[(2, 1, 12)]["roofline_weight_bytes"] < by[(1, 1, 12)]["roofline_weight_bytes"]
