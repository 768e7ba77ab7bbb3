"""The benchmark scripts import without a GPU (no sys.path patches: they run as `python -m benchmarks.NAME`) and
parse their arguments; what they time needs a GPU (and, for most, Triton)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tp_runtime.ops.fp8_gemm import Fp8GemmConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")

# script -> (arguments, attribute -> parsed value) of parse_args
ARGS = {
    "allreduce": ([], {"nproc": 2, "output": "out/bench/allreduce"}),
    "attention_sweep": (["dir", "--cache", "fp8", "--variant", "64,64,1,8,2"],
                        {"out": Path("dir"), "cache": "fp8", "variant": ["64,64,1,8,2"]}),
    "attention_prefill_sweep": (["--tokens", "64"], {"tokens": "64", "out": "out/attention_prefill"}),
    "fp8_gemm": (["--tp", "8"], {"tp": 8, "model": "v4_flash", "sweep": False}),
    "fp8_gemm_profile": (["--m", "8", "--config", "triton,16,64,2,4,4,1,q"],
                         {"m": 8, "n": 4096, "config": Fp8GemmConfig("triton", 16, 64, 2, 4, 4, True)}),
    "fp8_gemm_tune": (["--tp", "1", "8", "--budget-s", "60"], {"tp": [1, 8], "budget_s": 60.0,
                                                               "models": ["v4_flash", "v4_pro"]}),
    "indexer_sweep": (["dir", "--batches", "1", "--indexer-q", "bf16", "e4m3"],
                      {"out": Path("dir"), "batches": [1], "rounds": 3, "indexer_q": ["bf16", "e4m3"]}),
    "gemv_bf16": (["--out", "x.jsonl", "--m", "1", "2"], {"out": "x.jsonl", "m": [1, 2], "tp": [1, 2, 4, 8]}),
    "kernels_per_layer": (["runtime.streams=1"], {"overrides": ["runtime.streams=1"], "tp": "1,8"}),
    "loop_overhead": (["--steps", "5"], {"steps": 5, "out": "out/loop_overhead"}),
    "pdl_edges": ([], {"kernels": 200, "replays": 50}),
    "prefill_profile": (["--chunks", "512"], {"chunks": "512", "out": "out/prefill_profile"}),
    "replicated_work": (["dir"], {"out": Path("dir")}),
    "time_kernels": (["dir", "--sweep"], {"out": Path("dir"), "sweep": True, "fp8_cache": False}),
}


def test_every_script_is_listed():
    assert set(SCRIPTS) - {"replot"} == set(ARGS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_without_a_gpu_or_path_patch(name):
    source = (ROOT / "benchmarks" / f"{name}.py").read_text()
    assert "sys.path" not in source
    importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("name", sorted(ARGS))
def test_script_parses_its_arguments(name):
    argv, expected = ARGS[name]
    args = importlib.import_module(f"benchmarks.{name}").parse_args(argv)
    assert {k: getattr(args, k) for k in expected} == expected


@pytest.mark.parametrize("name", sorted(ARGS))
def test_script_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"benchmarks.{name}").parse_args(["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


def test_fp8_gemm_tune_charges_a_quantize_launch():
    from benchmarks.fp8_gemm_tune import EXTRA_LAUNCH_MS, extra_launches, pick
    from tp_runtime.ops.fp8_gemm import Fp8GemmConfig

    prologue = Fp8GemmConfig("triton", 16, 64, 1, 4, 4, True)  # x rounded in the kernel
    separate = [Fp8GemmConfig("triton", 16, 64, 1, 4, 4, False), Fp8GemmConfig("wgmma", 16, 64, 1, 4, 4, False),
                Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False)]
    assert extra_launches(prologue) == extra_launches(Fp8GemmConfig("gemv", 1, 16, 1, 4, 3, True, 512)) == 0
    assert [extra_launches(c) for c in separate] == [1, 1, 1]
    for c in separate:  # within the charge the one-launch GEMM wins; beyond it the faster one does
        assert pick([(6.3e-3, prologue), (6.3e-3 - 0.5 * EXTRA_LAUNCH_MS, c)]) == (6.3e-3, prologue)
        assert pick([(6.3e-3, prologue), (6.3e-3 - 2 * EXTRA_LAUNCH_MS, c)])[1] == c


def test_fp8_gemm_tune_repicks_a_table_from_recorded_timings(tmp_path):
    import json

    from benchmarks.fp8_gemm_tune import EXTRA_LAUNCH_MS, repick
    from tp_runtime.ops.fp8_gemm import Fp8GemmConfig

    one = Fp8GemmConfig("triton", 16, 64, 1, 4, 4, True)
    two = Fp8GemmConfig("wgmma", 16, 64, 1, 4, 4, False)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"meta": {}, "entries": {"256,512,1": {"8": two._asdict(), "16": two._asdict()}}}))
    runs = [(8, one, 1e-2), (8, two, 1e-2 - EXTRA_LAUNCH_MS / 2),  # within the charge: the one-launch GEMM
            (16, one, 1e-2), (16, two, 1e-2 - 2 * EXTRA_LAUNCH_MS)]  # beyond it: the faster one
    rows = [{"N": 256, "K": 512, "groups": 1, "M": m, "config": c._asdict(), "ms": ms} for m, c, ms in runs]
    rows.append({"N": 256, "K": 512, "groups": 1, "M": 8, "config": two._asdict(), "error": "out of memory"})
    timings = tmp_path / "t.jsonl"
    timings.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entries, changed = repick(timings, table)
    assert changed == 1 and entries["256,512,1"] == {"8": one._asdict(), "16": two._asdict()}


def test_fp8_gemm_tune_warp_specialized_candidates_fit_one_sm():
    # Every wgmma_ws launch the tuner tries at Flash's and Pro's shards: a warpgroup's accumulator and products in
    # its registers (WS_MAX_TILE values a tile, three at most), two waits' worth of stages, a tile's rows inside
    # one group, the ring in 200 KB of shared memory
    # (~17 KB more goes to the store's layout change; 227 KB is an SM's), x rounded by one launch first.
    from benchmarks.fp8_gemm_tune import extra_launches, wgmma_ws_candidates, ws_stage_bytes
    from tp_runtime.config import load_config
    from tp_runtime.ops.fp8_gemm_wgmma import WS_MAX_TILE, wgmma_fits
    from tp_runtime.weights.specs import fp8_gemm_shapes

    root = Path(__file__).resolve().parents[1]
    seen = 0
    for name in ("v4_flash", "v4_pro"):
        for tp in (1, 2, 4, 8):
            for n, k, groups in fp8_gemm_shapes(load_config(root / "configs" / f"{name}.yaml").model, tp).values():
                for bucket in (8, 16, 32, 64, 128, 256, 512):
                    for c in wgmma_ws_candidates(bucket, n, k, groups, 132):
                        stage = ws_stage_bytes(c.block_m, c.block_n)
                        tile = c.block_n * c.block_m * 4 // c.num_warps  # a warpgroup's fp32 tile
                        assert tile <= WS_MAX_TILE and (c.k_per_wait + 1) * tile <= 3 * WS_MAX_TILE, c
                        assert c.num_stages >= 2 * c.k_per_wait, c
                        assert wgmma_fits(n, k, groups, c.block_n) and c.num_stages >= 2, c
                        assert c.num_stages * stage <= 200 * 1024 and c.block_m <= max(16, bucket), c
                        assert extra_launches(c) == 1
                        seen += 1
    assert seen > 1000


def test_fp8_gemm_profile_refuses_a_malformed_launch(capsys):
    from benchmarks.fp8_gemm_profile import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--config", "wgmma,64,64"])
    assert "kernel,block_m,block_n,splits,warps,stages,in_flight" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--config", "wgmma_ws,64,64,1,4,6,1,x2"])
    c = parse_args(["--config", "wgmma_ws,64,64,1,4,6,1,k2"]).config
    assert (c.kernel, c.num_stages, c.k_per_wait, c.quant_x) == ("wgmma_ws", 6, 2, False)
    assert parse_args(["--config", "triton,16,64,1,4,4,1,q"]).config.quant_x


def test_indexer_sweep_baseline_imports_the_ops_files_beside_it(tmp_path):
    # A baseline indexer_topk.py takes the topk_select.py and indexer_scores_wgmma.py beside it (another
    # revision's select and score kernels, not this tree's), and this tree's modules stay in place afterwards.
    import sys

    from benchmarks.indexer_sweep import BASELINE_SIBLINGS, load_baseline

    ops = ROOT / "tp_runtime" / "ops"
    for name in ("indexer_topk",) + BASELINE_SIBLINGS:
        (tmp_path / f"{name}.py").write_text((ops / f"{name}.py").read_text())
    own = {n: sys.modules[f"tp_runtime.ops.{n}"] for n in BASELINE_SIBLINGS}
    base = load_baseline(tmp_path / "indexer_topk.py")
    assert base.split_hist_width.__module__ == "baseline_topk_select"
    assert base.codes_scores.__module__ == "baseline_indexer_scores_wgmma"
    assert all(sys.modules[f"tp_runtime.ops.{n}"] is m for n, m in own.items())
    (tmp_path / "indexer_scores_wgmma.py").unlink()  # without a sibling: this tree's module
    assert load_baseline(tmp_path / "indexer_topk.py").codes_scores.__module__ == "tp_runtime.ops.indexer_scores_wgmma"
