"""Tests of `tp-runtime bench`: sweep machinery on a tiny CPU sweep (local launcher, tp 1 and 2; torchrun),
roofline arithmetic against hand-computed bytes, cache seeding against a real prefill, outputs, plots,
bad sweep keys, the all-reduce benchmark on gloo; GPU variants are marked `gpu`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
import torch

from conftest import STOP, STOP_TIMEOUT_S, run_cli, stopped_at

from tp_runtime.bench.cache_fill import fill_by_prefill, fill_seeded, prefill_plans
from tp_runtime.bench.entry import bench_entry
from tp_runtime.bench.flops import prefill_flops, weight_params
from tp_runtime.bench.measure import BreakTimer, ratio_stats
from tp_runtime.bench.plots import write_plots
from tp_runtime.bench.report import read_jsonl, split_records, write_jsonl
from tp_runtime.bench.roofline import layer_cache_bytes, model_seconds, step_bytes
from tp_runtime.bench.sweep import launch_plan
from tp_runtime.bench.sweep_config import load_sweep
from tp_runtime.cli import main as cli_main
from tp_runtime.config import ConfigError, load_config
from tp_runtime.memory_model import layer_weight_bytes
from tp_runtime.executor.worker import Worker
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import TPGroup, single_process

ROOT = Path(__file__).resolve().parents[1]
TINY_SWEEP = ROOT / "configs" / "bench_tiny.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    return env


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


# ------------------------------------------------------------------ the sweep, end to end


def test_tiny_sweep_local_tp1_tp2(tmp_path, capsys):
    """tp 1 and 2 (elastic launcher), batches 1 and 4, contexts 12 and 150, eager: records, tables, plots."""
    rc = cli_main(["bench", str(TINY_SWEEP), f"bench.output={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 0
    summ = _last_json(out)
    assert "step ms" in out and "tp_vs_tp1" in out  # both tables printed
    d = tmp_path / "tiny"
    points, comps = read_jsonl(d / "points.jsonl"), read_jsonl(d / "comparisons.jsonl")
    # 2 tp x 2 batch x 2 contexts seeded, plus one prefill-built point per tp.
    assert len(points) == summ["points"] == 10
    seeded = {(p["tp"], p["batch"], p["context"]) for p in points if p["cache_fill"] == "seeded"}
    assert seeded == {(t, b, c) for t in (1, 2) for b in (1, 4) for c in (12, 150)}
    assert {(p["tp"], p["batch"], p["context"]) for p in points if p["cache_fill"] == "prefill"} == {(1, 1, 12),
                                                                                                       (2, 1, 12)}
    for p in points:
        assert p["outputs_finite"] and p["timer"].startswith("perf_counter")
        assert p["kernels"] == "torch"  # runtime.kernels=auto on a CPU
        assert 0 < p["step_ms_min"] <= p["step_ms_median"] <= p["step_ms_p90"] <= p["step_ms_max"]
        assert len(p["step_ms_repeats"]) == 2 and len(p["step_ms_ranks"]) == p["tp"]
        assert p["roofline_ratio"] == pytest.approx(p["step_ms_median"] / p["roofline_model_ms"])
        # The roofline divides by the higher of the two measured ceilings, and records both.
        assert p["copy_GBps"] > 0 and p["read_GBps"] > 0 and p["roofline_GBps"] == max(p["copy_GBps"], p["read_GBps"])
        assert p["break_fraction"] == 1.0  # eager: the whole step is the eager region
        assert p["kernels_per_step"] is None and p["gpu_busy_ms"] is None  # no CUDA profiler on a CPU
        assert p["prefill_tokens_per_s"] > 0 and (p["allreduce_ms_eager"] > 0) == (p["tp"] == 2)
    tp_cmp = [c for c in comps if c["what"] == "tp_vs_tp1"]
    assert len(tp_cmp) == 4 and all(c["interleaved"] and c["repeats"] == 2 for c in tp_cmp)
    for c in tp_cmp:
        assert c["speedup"] == pytest.approx(c["baseline_ms_median"] / c["variant_ms_median"])
        assert c["speedup_min"] <= c["speedup_q1"] <= c["speedup_q3"] <= c["speedup_max"]
        assert c["efficiency"] == pytest.approx(c["speedup"] / 2)
    fill_cmp = [c for c in comps if c["what"] == "prefill_vs_seeded"]  # interleaved on two sets of slots
    assert {c["tp"] for c in fill_cmp} == {1, 2} and all(c["interleaved"] and c["repeats"] == 2 for c in fill_cmp)
    assert all(p["first_slot"] == (1 if p["cache_fill"] == "prefill" else 0) for p in points)
    partial = read_jsonl(d / "partial.jsonl")  # appended point by point over both tp launches
    assert sorted(map(json.dumps, partial)) == sorted(map(json.dumps, points + comps))
    assert json.loads((d / "summary.json").read_text()) == summ and summ["plots"] == "written"
    for name in ("step_time_vs_batch.png", "speedup_vs_tp.png", "roofline_ratio_vs_context.png"):
        assert name in summ["files"]
        _assert_png(d / name)


def test_tiny_sweep_under_torchrun(tmp_path):
    """torchrun starts the ranks; the same entry runs the tp = WORLD_SIZE points."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tp_runtime.bench", str(TINY_SWEEP), "grid.bench.batch=[2]", "grid.bench.context=[20]",
           "bench.repeats=1", "bench.plots=false", f"bench.output={tmp_path}"]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    summ = _last_json(r.stdout)
    assert summ["launcher"] == "torchrun" and summ["tp"] == [2] and summ["all_outputs_finite"]
    points = read_jsonl(tmp_path / "tiny" / "points.jsonl")
    assert [(p["tp"], p["cache_fill"]) for p in points] == [(2, "seeded"), (2, "prefill")]


def test_tiny_sweep_under_ray(tmp_path, capsys):
    """parallel.launcher=ray: real Ray actors run bench_entry."""
    rc = cli_main(["bench", str(TINY_SWEEP), "parallel.launcher=ray", "grid.parallel.tp=[2]", "grid.bench.batch=[2]",
                   "grid.bench.context=[20]", "bench.repeats=1", "bench.plots=false", f"bench.output={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    summ = _last_json(out)
    assert summ["launcher"] == "ray" and summ["tp"] == [2] and summ["points"] == 2 and summ["all_outputs_finite"]


# ------------------------------------------------------------------ sweep config errors


@pytest.mark.parametrize("word, needle", [
    ("grid.runtime.max_len=[64]", "unknown grid key 'runtime.max_len'"),
    ("grid.model.no_such_dim=[1]", "unknown grid key 'model.no_such_dim'"),
    ("bench.warmup=3", "unknown key 'bench.warmup'"),
    ("grid.modes=[eager,fast]", "'modes' holds ['fast']"),
    ("grid.bench.batch=[0]", "'bench.batch' holds [0]"),
    ("grid.parallel.tp=[3]", "'parallel.tp'=3 must divide"),
    ("grid.model.num_hidden_layers=two", "must be a non-empty list"),
    ("bench.repeats=0", "'bench.repeats' must be >= 1"),
    ("bench.prefill_chunk=0", "'bench.prefill_chunk' must be a token count >= 1 or a non-empty list"),
    ("bench.prefill_chunk=[512, 0]", "'bench.prefill_chunk' must be a token count >= 1 or a non-empty list"),
    ("bench.prefill_chunk=[]", "'bench.prefill_chunk' must be a token count >= 1 or a non-empty list"),
    ("bench.prefill_chunk=[8, x]", "'bench.prefill_chunk' must be int or list, got list [8, 'x']"),
    ("bench.peak_tflops=0", "'bench.peak_tflops' must be a finite TFLOP/s > 0"),
    ("bench.peak_tflops=.inf", "'bench.peak_tflops' must be a finite TFLOP/s > 0"),
    ("nonsense.key=1", "unknown key 'nonsense.key'"),
])
def test_bad_sweep_keys_are_refused(word, needle):
    with pytest.raises(ConfigError) as e:
        load_sweep(TINY_SWEEP, [word])
    assert needle in str(e.value)


def test_bad_sweep_file_via_cli(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {ROOT / 'configs' / 'tiny.yaml'}\ngrid: {{bench.batch: [1]}}\nbenchmark: {{}}\n")
    assert cli_main(["bench", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'benchmark'" in err and str(bad) in err


def test_bad_base_file_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text("model: [unclosed\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: base.yaml\ngrid: {bench.batch: [1], bench.context: [8]}\n")
    with pytest.raises(ConfigError, match=r"base\.yaml:2:1: not valid YAML: "):
        load_sweep(sweep)
    sweep.write_text("base: missing.yaml\ngrid: {bench.batch: [1], bench.context: [8]}\n")
    with pytest.raises(ConfigError, match="file 'missing.yaml' not found"):
        load_sweep(sweep)


def test_worker_configs_follow_the_grid():
    sweep = load_sweep(TINY_SWEEP, ["grid.modes=[eager,breakable-wide]", "grid.model.num_hidden_layers=[3,6]"])
    assert len(sweep.variants()) == 2
    cfg = sweep.worker_config(2, sweep.variants()[0], "breakable-wide")
    assert (cfg.parallel.tp, cfg.model.num_hidden_layers, cfg.graph.mode, cfg.graph.break_scope) == (2, 3, "breakable",
                                                                                                     "wide")
    assert cfg.graph.capture_sizes == [4, 1] and cfg.runtime.max_seqs == 4
    assert cfg.runtime.max_len == 150 + sweep.headroom()


# ------------------------------------------------------------------ roofline arithmetic


def _tiny():
    return load_config(ROOT / "configs" / "tiny.yaml").model


def test_roofline_bytes_by_hand():
    """tiny dims: hidden 64, H 8, D 32, Rq 32, G 4, Ro 16, W 16, Ih 8, Id 16, K 8; tp 2, fp32 (4 B)."""
    m = _tiny()
    # Every layer: wq_b 8*32*32/2 = 4096, wo_a 64*64/2 = 2048, wo_b 64*64/2 = 2048, wq_a+wkv (32+32)*64 = 4096,
    # q_norm 32 + kv_norm 32 + attn_norm 64 = 128 -> 12416 elements * 4 B = 49664, attn_sink 4 heads * 4 B = 16.
    swa = 49664 + 16
    # r = 128 compressor: wkv + wgate 2*32*64 = 4096, norm 32 -> 4128 * 4 = 16512; ape 128*32 fp32 = 16384.
    hca = swa + 16512 + 16384
    # r = 4 compressor (c = 2): 2*64*64 = 8192 + norm 32 -> 32896 B; ape 4*64*4 = 1024.
    # indexer: wq_b 8*16*32 = 4096 + weights_proj 8*64 = 512 -> 18432 B; its compressor (dim 16, c = 2):
    # 2*32*64 = 4096 + norm 16 -> 16448 B; ape 4*32*4 = 512.
    csa = swa + 32896 + 1024 + 18432 + 16448 + 512
    assert [layer_weight_bytes(m, r, 2, 4) for r in (0, 128, 4)] == [swa, hca, csa] == [49680, 82576, 118992]
    # Cache, batch 3, ctx 150: window min(16, 150) = 16 rows of 32 = 512; r = 4: top-K min(8, 37) = 8 rows
    # of 32 = 256 plus 37 indexer keys of 16 = 592; r = 128: 150 // 128 = 1 row of 32.
    assert layer_cache_bytes(m, 0, 3, 150, 4) == 3 * 512 * 4
    assert layer_cache_bytes(m, 4, 3, 150, 4) == 3 * (512 + 256 + 592) * 4
    assert layer_cache_bytes(m, 128, 3, 150, 4) == 3 * (512 + 32) * 4
    # Short context: window min(16, 10) = 10 rows; r = 4: min(8, 2) = 2 rows + 2 keys; r = 128: none.
    assert layer_cache_bytes(m, 4, 1, 10, 2) == (10 * 32 + 2 * 32 + 2 * 16) * 2
    # tiny layers [0, 4, 128, 4, 128, 0]
    sb = step_bytes(m, 2, 3, 150, 4)
    assert (sb.weights, sb.cache) == (2 * (swa + csa + hca), 2 * (6144 + 16320 + 6528))
    # 1 GB/s, 6 layers of 10 us all-reduce at tp 2; no collective at tp 1.
    assert model_seconds(10**9, 1e9, 6, 1e-5, 2) == pytest.approx(1.0 + 6e-5)
    assert model_seconds(10**9, 1e9, 6, 1e-5, 1) == pytest.approx(1.0)


def test_roofline_weights_equal_a_shards_parameters():
    """The weight term is exactly what a tp = 2 shard holds (rank 1's parameters, counted by torch)."""
    m = _tiny()
    shard = AttentionStack(m, TPGroup(rank=1, size=2, device=torch.device("cpu")), 64, torch.bfloat16,
                           torch.device("cpu"))
    held = sum(p.numel() * p.element_size() for p in shard.parameters())
    assert step_bytes(m, 2, 1, 1, 2).weights == held


def test_roofline_weights_match_the_specs_flash_figures():
    """DSV4_ATTENTION.md: ~107M parameters per layer in wq_a/wkv/wq_b/wo_a/wo_b (100.7M of them sharded),
    +19.1M (r = 4) or +4.3M (r = 128) replicated, ~5.09B over 43 layers. At 1 byte per element the byte
    count is the parameter count plus small fp32 extras (sink, ape, norms): within 0.5 %."""
    m = load_config(ROOT / "configs" / "v4_flash.yaml").model
    count = {r: layer_weight_bytes(m, r, 1, 1) for r in (0, 4, 128)}
    assert count[0] == pytest.approx(107.0e6, rel=5e-3)
    assert count[4] - count[0] == pytest.approx(19.1e6, rel=5e-3)
    # r = 128: ape [128, 512] is fp32, 3 bytes per element above the 1-byte count; 4.26M quoted as 4.3M.
    assert count[128] - count[0] - 3 * 128 * 512 == pytest.approx(4.3e6, rel=2e-2)
    assert count[0] - layer_weight_bytes(m, 0, 4, 1) == pytest.approx(100.7e6 * 3 / 4, rel=5e-3)
    assert step_bytes(m, 1, 0, 0, 1).weights == pytest.approx(5.09e9, rel=5e-3)


def test_scaling_sweep_config_is_the_h200_grid():
    sweep = load_sweep(ROOT / "configs" / "bench_scaling.yaml")
    assert sweep.tps == [1, 2, 4]
    assert sweep.modes == ["eager", "breakable-wide", "breakable-hoisted", "breakable-narrow", "full",
                           "full_and_breakable"]
    assert sweep.grid["bench.batch"] == [1, 8, 32, 128] and sweep.grid["bench.context"] == [4096, 32768]
    cfg = sweep.worker_config(4, sweep.variants()[0], "breakable-hoisted")
    assert (cfg.model.hidden_size, cfg.model.num_attention_heads, cfg.model.num_hidden_layers) == (4096, 64, 43)
    assert cfg.graph.capture_sizes == [128, 32, 8, 1] and cfg.parallel.launcher == "local"
    # The six modes' lanes continue the same sequences: headroom for all of their steps and chunks.
    s = sweep.bench
    per_mode = (s.warmup_steps + s.repeats * s.timed_steps + s.break_steps + s.profile_steps
                + (1 + s.prefill_steps) * s.prefill_chunk)
    assert cfg.runtime.max_len == 32768 + sweep.headroom() == 32768 + 6 * per_mode
    full = sweep.worker_config(1, sweep.variants()[0], "full_and_breakable")
    assert (full.graph.mode, full.graph.break_scope) == ("full_and_breakable", "narrow")


# ------------------------------------------------------------------ cache seeding vs real prefill


def _tiny_worker() -> Worker:
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ["parallel.tp=1", "runtime.max_seqs=3", "runtime.max_len=400",
                                                       "runtime.dtype=float32"])
    return Worker(cfg, single_process(torch.device("cpu")))


@pytest.mark.parametrize("context,first", [(11, 0), (37, 1), (300, 0)])  # inside W, past W, past a 128-block
def test_seeded_fill_writes_exactly_the_rows_a_prefill_writes(context, first):
    prefilled, seeded = _tiny_worker(), _tiny_worker()
    for w in (prefilled, seeded):  # stale rows from an earlier, longer sequence must be cleared
        fill_seeded(w.caches, w.stack.ratios, 3, 380, seed=7)
    fill_by_prefill(prefilled, 2, context, 48, seed=0, first_slot=first)
    fill_seeded(seeded.caches, seeded.stack.ratios, 2, context, seed=1, first_slot=first)
    n_checked, filled = 0, slice(first, first + 2)
    for ca, cb in zip(prefilled.caches, seeded.caches):
        for ta, tb in zip(ca.tensors(), cb.tensors()):
            assert torch.equal(ta[filled] != 0, tb[filled] != 0), f"occupancy differs for a {tuple(ta.shape)} cache"
            if first:  # the slot before the filled ones keeps its stale rows
                assert torch.equal(ta[0] != 0, tb[0] != 0) and bool((ta[0] != 0).any())
            n_checked += 1
    assert n_checked == 2 * 1 + 2 * 7 + 2 * 4  # 2 window-only, 2 CSA (7 tensors), 2 HCA (4 tensors)
    r4 = seeded.caches[1]  # a CSA layer: compressed rows 0..c//4-1 exactly
    assert int((r4.compressed[first] != 0).any(-1).sum()) == context // 4
    # Decode after the seeded fill: finite outputs and the scale of a normal step's output.
    from tp_runtime.bench.steps import decode_plan
    from tp_runtime.engine.workload import Workload

    plan = decode_plan(2, context, first)
    out, _ = seeded.step(plan, Workload([], 64, 0).step_inputs(plan, seeded.device, seeded.dtype))
    ref, _ = prefilled.step(plan, Workload([], 64, 0).step_inputs(plan, prefilled.device, prefilled.dtype))
    assert torch.isfinite(out).all()
    # Same inputs, different (random vs real) cache rows of the same scale: output norms within 2x
    # (the residual stream dominates both; a wrong scale, e.g. unnormalized rows, breaks this).
    assert 0.5 < float(out.norm() / ref.norm()) < 2.0


def test_prefill_plans_cover_every_position_once():
    plans = prefill_plans(2, 100, 48)
    covered = sorted((c.slot, p) for plan in plans for c in plan.chunks for p in range(c.start, c.start + c.length))
    assert covered == [(s, p) for s in range(2) for p in range(100)]
    assert max(plan.n_tokens for plan in plans) == 48


# ------------------------------------------------------------------ measurement pieces, outputs


def test_ratio_stats_by_hand():
    base = [[4.0, 4.0, 4.0], [6.0, 6.0, 6.0]]  # medians 4, 6
    var = [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]  # medians 2, 2
    s = ratio_stats(base, var)
    # all steps: median(base) = 5 over median(var) = 2 -> 2.5; per repeat 2 and 3.
    assert s["ratio"] == 2.5 and s["ratio_min"] == 2.0 and s["ratio_max"] == 3.0 and s["repeats"] == 2
    with pytest.raises(ValueError):
        ratio_stats(base, var[:1])


def test_break_timer_sums_eager_calls_per_step():
    # Each step's sum lies between the calls' own times (taken inside them) and the times around the timer's
    # calls, whatever the machine's load does to the sleeps; on CPU both clocks are the host's.
    bt = BreakTimer(torch.device("cpu"))
    inside, around = [0.0, 0.0], [0.0, 0.0]
    for step, naps in enumerate(([0.02, 0.01], [0.03])):
        bt.next_step()
        for nap in naps:
            def call(nap=nap, step=step):
                t = time.perf_counter()
                time.sleep(nap)
                inside[step] += (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            bt(call)
            around[step] += (time.perf_counter() - t) * 1e3
    per, host = bt.per_step_ms(), bt.per_step_ms(host=True)
    assert len(per) == 2 and len(host) == 2 and bt.calls == 3
    for sums in (per, host):
        assert all(30 <= inside[i] <= sums[i] <= around[i] for i in range(2)), (inside, sums, around)


def _fake_points() -> tuple[list[dict], list[dict]]:
    points, comps = [], []
    for tp in (1, 2, 4):
        for mode in ("eager", "breakable-hoisted"):
            for b in (1, 8):
                for ctx in (4096, 32768):
                    points.append({"tp": tp, "mode": mode, "batch": b, "context": ctx, "cache_fill": "seeded",
                                   "variant": "base", "step_ms_median": 1.0 + b / tp, "roofline_ratio": 2.0 + tp,
                                   "roofline_model_ms": 1.0 + 1.0 / tp})
                    if tp > 1:
                        comps.append({"what": "tp_vs_tp1", "tp": tp, "variant_mode": mode, "batch": b,
                                      "context": ctx, "variant": "base", "speedup": tp * 0.8,
                                      "speedup_min": tp * 0.7, "speedup_max": tp * 0.9})
    return points, comps


def test_plots_are_valid_pngs(tmp_path):
    points, comps = _fake_points()
    names = write_plots(points, comps, tmp_path)
    assert names == ["step_time_vs_batch.png", "speedup_vs_tp.png", "roofline_ratio_vs_context.png"]
    for n in names:
        _assert_png(tmp_path / n)


def test_replot_redraws_a_sweep_folder_from_its_json(tmp_path):
    points, comps = _fake_points()
    write_jsonl(tmp_path / "points.jsonl", points)
    write_jsonl(tmp_path / "comparisons.jsonl", comps)
    r = subprocess.run([sys.executable, "-m", "benchmarks.replot", str(tmp_path)], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("step_time_vs_batch.png", "speedup_vs_tp.png", "roofline_ratio_vs_context.png"):
        _assert_png(tmp_path / name)
    r = subprocess.run([sys.executable, "-m", "benchmarks.replot", str(tmp_path / "none")], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "points.jsonl is missing" in r.stderr


def test_allreduce_benchmark_on_gloo(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.allreduce", "--nproc", "2", "--device", "cpu",
           "--max-bytes", str(32 << 10), "--iters", "3", "--output", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    res = _last_json(r.stdout)
    assert [row["bytes"] for row in res["rows"]] == [8 << 10, 16 << 10, 32 << 10]
    assert all(row["eager_us"] > 0 and row["graph_us"] is None for row in res["rows"])
    assert res["graph"].startswith("skipped") and res["backend"] == "gloo"
    assert json.loads(Path(res["file"]).read_text())["rows"] == res["rows"]


def test_a_stopped_rank_ends_a_tp2_sweep_within_the_timeout(tmp_path):
    # Rank 1 SIGSTOPs itself as its 6th step begins (a hung rank): rank 0's collective times out, the
    # heartbeat names rank 1, rank 0 ends it, and the launcher reports it, within the bound of `run`.
    r = run_cli(["bench", str(TINY_SWEEP), "grid.parallel.tp=[2]", "grid.bench.batch=[2]", "grid.bench.context=[12]",
                 "bench.prefill_check=false", f"bench.output={tmp_path}", "parallel.fail_rank=1", *STOP],
                timeout_s=120)
    assert r.returncode == 1, r.stderr[-3000:]
    # the CLI's error line (the killed rank's leaked semaphores may be reported after it)
    err = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith("error: rank 1 failed"), r.stderr[-3000:]
    assert "rank 1 (host " in err[0] and "stopped answering" in err[0], err
    after = r.ended - stopped_at(r.stderr, 1)
    assert STOP_TIMEOUT_S - 1 < after < STOP_TIMEOUT_S + 10, after  # run_cli also asserts no process is left


# ------------------------------------------------------------------ the record's keys (BenchRecord.to_json)

# The keys of an eager CPU point record (seeded cache) and of a comparison record as the records were built
# before BenchRecord (dicts), captured from a tiny tp 1 run of that code: the JSON lines keep every key.
POINT_KEYS_BEFORE = [
    "kind", "name", "batch", "context", "variant", "cache_fill", "first_slot", "tp", "launcher", "mode",
    "graph_mode", "break_scope", "graph_captured", "replayed_fraction", "graphs", "device", "device_name", "dtype",
    "weight_format", "fp8_activations", "cache_format", "kernels", "pdl", "streams", "weight_bytes_per_rank",
    "cache_bytes_per_rank", "memory_bytes_per_rank", "largest_batch_by_context", "layers", "layer_ratios",
    "hidden_size", "num_attention_heads", "timer", "warmup_steps", "timed_steps", "repeats", "step_ms_median",
    "step_ms_p90", "step_ms_min", "step_ms_max", "step_ms_repeats", "step_ms_ranks", "decode_tokens_per_s",
    "outputs_finite", "allreduce", "allreduce_path", "allreduce_requested", "allreduce_reason",
    "allreduce_threshold_bytes", "allreduce_buffer_bytes", "allreduce_probe_us", "break_ms_median",
    "break_fraction", "break_host_fraction", "eager_breaks_per_step", "break_source", "kernels_per_step",
    "copies_per_step", "gpu_busy_ms", "gpu_ms_by_kernel", "step_vs_gpu_busy", "profile_source", "prefill_chunk",
    "prefill_ms_median", "prefill_tokens_per_s", "allreduce_bytes", "allreduce_ms_eager", "allreduce_ms_graph",
    "allreduce_ms_path", "copy_GBps", "read_GBps", "roofline_GBps", "roofline_bandwidth", "copy_bytes",
    "copy_method", "roofline_weight_bytes", "roofline_cache_bytes", "roofline_bytes", "roofline_comm_ms",
    "roofline_model_ms", "roofline_ratio", "roofline_ratio_below_1", "fill_s"]
PREFILL_FILL_KEYS_BEFORE = ["fill_prefill_tokens_per_s"]  # besides those, on a prefill-built point
# Keys a point record has gained since: the host's time per step and the prefill throughput against FLOPs.
ADDED_KEYS = ["host_ms_per_step", "prefill_context", "prefill_flops", "prefill_tflops", "prefill_peak_tflops",
              "prefill_peak_share", "prefill_by_chunk", "profile_view_bytes", "profile_view_bw_share"]
PROJECTED_KEYS_BEFORE = [
    "projected", "shard_of_tp", "shard_rank", "rank_step_ms", "rank_roofline_ms", "rank_roofline_ratio",
    "projected_allreduce_us", "projected_comm_ms", "projected_step_ms", "projected_roofline_ms",
    "projected_speedup", "projected_roofline_speedup", "projected_speedup_baseline"]
COMPARISON_KEYS_BEFORE = [
    "kind", "what", "name", "batch", "context", "variant", "tp", "variant_mode", "variant_lane", "baseline",
    "device", "interleaved", "variant_ms_median", "baseline_ms_median", "speedup", "speedup_q1", "speedup_q3",
    "speedup_min", "speedup_max", "repeats"]


def _tiny_records(tmp_path: Path, *words: str) -> list[dict]:
    """Rank 0's records of a tiny tp 1 sweep run in this process through bench_entry (batch 2, context 20)."""
    sweep = load_sweep(TINY_SWEEP, ["grid.parallel.tp=[1]", "grid.bench.batch=[2]", "grid.bench.context=[20]",
                                    "bench.repeats=1", f"bench.output={tmp_path}", *words])
    (cfg, bench_dict), = launch_plan(sweep)
    return bench_entry(cfg.to_dict(), bench_dict)


def test_record_keys_are_those_of_the_dict_records_and_prefill_has_its_flops(tmp_path):
    points, comps = split_records(_tiny_records(tmp_path, "grid.modes=[eager,breakable-hoisted]",
                                                "bench.prefill_chunk=[8, 16]"))
    seeded = [p for p in points if p["cache_fill"] == "seeded"]
    prefilled = [p for p in points if p["cache_fill"] == "prefill"]
    assert len(seeded) == len(prefilled) == 2 and {c["what"] for c in comps} == {"graphs_vs_eager",
                                                                                   "prefill_vs_seeded"}
    for p in seeded:
        assert set(p) == set(POINT_KEYS_BEFORE + ADDED_KEYS), set(p) ^ set(POINT_KEYS_BEFORE + ADDED_KEYS)
    for p in prefilled:
        assert set(p) == set(POINT_KEYS_BEFORE + PREFILL_FILL_KEYS_BEFORE + ADDED_KEYS)
    for c in comps:
        assert set(c) == set(COMPARISON_KEYS_BEFORE)
    # The values are the run's: this point, these lanes, these steps.
    for p in points:
        assert (p["batch"], p["context"], p["tp"], p["repeats"]) == (2, 20, 1, 1)
        assert p["step_ms_median"] > 0 and p["fill_s"] > 0 and len(p["step_ms_repeats"]) == 1
        # Both clocks are perf_counter on a CPU, and the step timer's marks sit just outside the host clock's
        # around Worker.step: every step's host ms is at most its step ms, so the medians are ordered too.
        assert 0 < p["host_ms_per_step"] <= p["step_ms_median"]
        by_chunk = p["prefill_by_chunk"]  # one entry per chunk size, in order, each timed after the one before
        assert [c["chunk"] for c in by_chunk] == [8, 16] and by_chunk[1]["context"] >= by_chunk[0]["context"] + 2 * 8
        for c in by_chunk:
            assert c["chunk_ms"] > 0 and c["flops"] > 0 and c["tflops"] > 0 and 0 < c["peak_share"] < 1
            assert c["flops"] == prefill_flops(_tiny(), 1, c["context"], c["chunk"])
            assert c["tokens_per_s"] == pytest.approx(c["chunk"] / (c["chunk_ms"] / 1e3))
            assert c["peak_share"] == pytest.approx(c["tflops"] / 790.0)
        first = by_chunk[0]  # the prefill_* fields are the first chunk size's
        assert (p["prefill_chunk"], p["prefill_ms_median"], p["prefill_context"], p["prefill_flops"],
                p["prefill_tflops"], p["prefill_peak_share"], p["prefill_peak_tflops"]) == (
            8, first["chunk_ms"], first["context"], first["flops"], first["tflops"], first["peak_share"], 790.0)
    assert {p["mode"] for p in seeded} == {"eager", "breakable-hoisted"}


def test_prefill_flops_by_hand():
    """tiny dims (test_roofline_bytes_by_hand), tp 2: a chunk of 4 tokens at positions 20..23."""
    m = _tiny()
    # GEMM parameters of a rank per layer: wq_a + wkv (32 + 32) * 64 = 4096, wq_b 8*32*32 / 2 = 4096, wo_a
    # 64*64 / 2 = 2048, wo_b 64*64 / 2 = 2048; r = 128 adds its compressor's wkv + wgate 2*32*64 = 4096; r = 4 its
    # compressor's 2*64*64 = 8192, the indexer's wq_b 8*16*32 = 4096, weights_proj 8*64 = 512, its compressor's
    # 2*32*64 = 4096.
    swa = 4096 + 4096 + 2048 + 2048
    hca, csa = swa + 4096, swa + 8192 + 4096 + 512 + 4096
    assert [weight_params(m, r, 2) for r in (0, 128, 4)] == [swa, hca, csa]
    # ... which is every 2-D weight a tp 2 shard holds (rank 1's, counted by torch; the ape tables are added).
    cpu = torch.device("cpu")
    shard = AttentionStack(m, TPGroup(rank=1, size=2, device=cpu), 64, torch.float32, cpu)
    held = sum(p.numel() for n, p in shard.named_parameters() if n.endswith(".weight") and p.dim() == 2)
    assert held == 2 * (swa + csa + hca)  # layers [0, 4, 128, 4, 128, 0]
    # Candidates at p = 20..23 (p + 1 = 21..24): window min(16, p + 1) = 16 rows each; r = 4 also picks
    # min(8, (p + 1) // 4) = 5, 5, 5, 6 rows; r = 128 has (p + 1) // 128 = 0. A row costs a QK and a PV dot of
    # D = 32 in each of Hl = 8 / 2 = 4 heads: 2 x 2 x 4 x 32 = 512 FLOPs.
    window, picked = 4 * 16, 5 + 5 + 5 + 6
    # The indexer (r = 4) scores (p + 1) // 4 = 5, 5, 5, 6 keys in Ih = 8 heads of Id = 16: 2 x 8 x 16 per key.
    indexer = 2 * 8 * 16 * (5 + 5 + 5 + 6)
    swa_f = 2 * swa * 4 + 512 * window  # 2 x params x 4 tokens + attention
    hca_f = 2 * hca * 4 + 512 * window
    csa_f = 2 * csa * 4 + 512 * (window + picked) + indexer
    assert prefill_flops(m, 2, 20, 4) == 2 * (swa_f + csa_f + hca_f)
    # Layers 3-4 alone (model.layers): one CSA and one HCA layer.
    m.layers = "3-4"
    assert prefill_flops(m, 2, 20, 4) == csa_f + hca_f


def test_projected_record_keys_are_those_of_the_dict_records(tmp_path):
    """A projected point (grid.shard_of_tp, given after loading: the loader refuses it on a CPU)."""
    sweep = load_sweep(TINY_SWEEP, ["grid.parallel.tp=[1]", "grid.bench.batch=[2]", "grid.bench.context=[20]",
                                    "bench.repeats=1", "bench.prefill_check=false", f"bench.output={tmp_path}"])
    sweep.grid["shard_of_tp"] = [1, 2]
    (cfg, bench_dict), = launch_plan(sweep)
    points = bench_entry(cfg.to_dict(), bench_dict)
    assert [p["shard_of_tp"] for p in points] == [1, 2]
    for p in points:
        assert set(p) == set(POINT_KEYS_BEFORE + PROJECTED_KEYS_BEFORE + ADDED_KEYS)


# ------------------------------------------------------------------ GPU (pytest -m gpu)


@pytest.mark.gpu
def test_gpu_tiny_sweep_all_modes(tmp_path, capsys):
    """Graph modes replay, breaks are timed by events, comparisons come out; tp 2 when 2 GPUs exist."""
    tps = "[1,2]" if torch.cuda.device_count() >= 2 else "[1]"
    rc = cli_main(["bench", str(TINY_SWEEP), "runtime.device=cuda", f"grid.parallel.tp={tps}",
                   "grid.modes=[eager,breakable-wide,breakable-hoisted,breakable-narrow,full,full_and_breakable]",
                   f"bench.output={tmp_path}"])
    assert rc == 0
    _last_json(capsys.readouterr().out)
    points = read_jsonl(tmp_path / "tiny" / "points.jsonl")
    comps = read_jsonl(tmp_path / "tiny" / "comparisons.jsonl")
    for p in points:
        assert p["timer"] == "cuda_events" and p["outputs_finite"] and p["copy_GBps"] > 100 and p["read_GBps"] > 100
        assert p["roofline_GBps"] == max(p["copy_GBps"], p["read_GBps"]) and p["copy_bytes"] >= 2**30
        # gpu_busy_ms sums kernel durations of separate profiled steps, overlapping side-stream kernels each,
        # so it is no bound on the replayed step's time (other tests sharing the GPU stretch either one)
        assert p["kernels_per_step"] > p["layers"] and 0 < p["gpu_busy_ms"] < float("inf")
        if p["mode"].startswith("breakable"):
            assert p["graph_captured"] and p["replayed_fraction"] == 1.0
            assert p["eager_breaks_per_step"] == p["layers"] and 0 < p["break_fraction"] <= 1.0
            assert 0 < p["break_host_fraction"] <= 1.0
        if p["mode"].startswith("full"):
            assert p["graph_captured"] and p["replayed_fraction"] == 1.0
            assert p["eager_breaks_per_step"] == 0 and p["break_fraction"] == 0.0
        if p["tp"] == 2:
            assert p["allreduce_ms_graph"] > 0
    whats = {c["what"] for c in comps}
    assert {"graphs_vs_eager", "hoisted_vs_wide", "full_vs_narrow", "prefill_vs_seeded"} <= whats


@pytest.mark.gpu
def test_gpu_allreduce_benchmark(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cmd = [sys.executable, "-m", "benchmarks.allreduce", "--nproc", "2", "--max-bytes", str(1 << 20),
           "--iters", "20", "--output", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = _last_json(r.stdout)
    assert res["backend"] == "nccl" and all(row["graph_us"] > 0 for row in res["rows"])


def test_profile_view_groups_kernels_by_the_code_that_launched_them():
    from tp_runtime.bench.profile import group_trace, kernel_group

    layers, attn = "tp_runtime/model/layers.py(48): forward", "tp_runtime/model/attention.py(130): stage_a"
    assert kernel_group(["<built-in method linear>", layers, attn], "nvjet_sm90_gemm") == "weight GEMMs"
    assert kernel_group(["tp_runtime/ops/torch_path.py(80): sparse_attention"], "gemm") == "attention"
    # the grouped wo_a's batched GEMM, launched from ops/linear.py inside the layer's stage C
    assert kernel_group(["tp_runtime/ops/linear.py(60): grouped_linear", "tp_runtime/model/attention.py(187): _wo_a"],
                        "nvjet_sm90_tst") == "weight GEMMs"
    assert kernel_group(["tp_runtime/model/layers.py(22): rms_norm", layers, attn], "elementwise") == "norms and rotary"
    assert kernel_group(["tp_runtime/ops/torch_path.py(30): gather_rows",
                         "tp_runtime/model/compressor.py(60): _pool"], "index_kernel") == "compressors"
    assert kernel_group(["tp_runtime/ops/torch_path.py(55): indexer_topk"], "radixSort") == "indexer"
    assert kernel_group([attn], "direct_copy_kernel") == "copies"
    assert kernel_group(["elsewhere.py(1): f"], "vectorized_elementwise") == "other"
    # A trace as the profiler writes it: Python frames nest on the launching thread; a kernel joins its
    # launch (runtime or driver call) by correlation id. Two steps: ms per step is half the durations.
    f = lambda name, ts, dur: {"cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    launch = lambda cat, ts, c: {"cat": cat, "name": "launch", "pid": 1, "tid": 1, "ts": ts, "dur": 1, "args": {
        "correlation": c}}
    kern = lambda name, c, dur: {"cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 0, "dur": dur,
                                 "args": {"correlation": c}}
    trace = {"traceEvents": [f(attn, 0, 100), f(layers, 10, 20), launch("cuda_driver", 15, 1),
                             f("tp_runtime/model/layers.py(22): rms_norm", 40, 10), launch("cuda_runtime", 45, 2),
                             launch("cuda_runtime", 60, 3), kern("nvjet_gemm", 1, 4000.0),
                             kern("reduce_kernel", 2, 1000.0), kern("softmax", 3, 600.0)]}
    ms = group_trace(trace, n_steps=2)
    assert (ms["weight GEMMs"], ms["norms and rotary"], ms["attention"]) == (2.0, 0.5, 0.3)
    assert ms["total"] == pytest.approx(2.8)


def test_kernels_by_layer_kind_counts_each_layers_launches_by_stream():
    from tp_runtime.bench.profile import kernels_by_layer_kind

    # Two steps of a two-layer stack (layer 0 window-only, layer 1 ratio 4). A launch belongs to the layer
    # range open around it on its thread; kernels on stream 7 (the one most kernels ran on) are the main
    # stream's, stream 9's the side stream's; a copy is counted apart; a launch outside every range is the step's.
    rng = lambda name, ts, dur: {"cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    launch = lambda ts, c: {"cat": "cuda_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": ts, "dur": 1,
                            "args": {"correlation": c}}
    kern = lambda c, stream, cat="kernel": {"cat": cat, "name": f"k{c}", "pid": 0, "tid": stream, "ts": 0, "dur": 1,
                                            "args": {"correlation": c, "stream": stream}}
    ev, c = [], 0
    for step in range(2):
        t0 = 1000 * step
        ev.append(launch(t0 + 1, c)), ev.append(kern(c, 7))  # the step index, before any layer
        c += 1
        ev.append(rng("layer 0 ratio 0", t0 + 10, 100))
        for i in range(3):
            ev.append(launch(t0 + 20 + i, c)), ev.append(kern(c, 7))
            c += 1
        ev.append(rng("layer 1 ratio 4", t0 + 200, 100))
        for stream in (7, 7, 9, 7):
            ev.append(launch(t0 + 210 + c % 50, c)), ev.append(kern(c, stream))
            c += 1
        ev.append(launch(t0 + 290, c)), ev.append(kern(c, 7, "gpu_memcpy"))
        c += 1
    got = kernels_by_layer_kind({"traceEvents": ev}, n_steps=2)
    assert got["0"].pop("names") == ["k1", "k2", "k3"]  # the first step's launches of that layer, in order
    assert got["4"].pop("names") == ["k4", "k5", "side:k6", "k7"]
    assert got["0"] == {"layers": 1, "kernels": 3, "main": 3, "side": 0, "copies": 0}
    assert got["4"] == {"layers": 1, "kernels": 4, "main": 3, "side": 1, "copies": 1}
    assert got["step"] == {"kernels": 1, "main": 1, "side": 0, "copies": 0}


def test_layer_ranges_name_every_layer_only_while_annotating():
    from torch.profiler import ProfilerActivity, profile

    from conftest import TINY_PATH
    from tp_runtime.bench.profile import LAYER_RANGE
    from tp_runtime.config import load_config
    from tp_runtime.executor.plan import SeqChunk, StepPlan
    from tp_runtime.executor.shard import ModelShard
    from tp_runtime.model.batch import LiveBatch
    from tp_runtime.parallel.group import single_process

    cfg = load_config(TINY_PATH, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=64", "runtime.max_seqs=1"])
    shard = ModelShard.build(cfg, single_process(torch.device("cpu")))
    plan = StepPlan((SeqChunk(0, 0, 0, 5, False),))
    live = LiveBatch()

    def ranges(annotate: bool) -> list[str]:
        shard.stack.annotate_layers = annotate
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            live.batch = b = shard.buffers.load(plan, torch.ones(5, cfg.model.hidden_size), 5)
            shard.stack(b.x, live, shard.caches, shard.attn_out, None)
        return [e.name for e in prof.events() if LAYER_RANGE.match(e.name)]

    want = [f"layer {i} ratio {cfg.model.compress_ratios[i]}" for i in cfg.model.layer_ids()]
    assert len(set(cfg.model.compress_ratios[i] for i in cfg.model.layer_ids())) > 1  # several kinds
    assert ranges(True) == want
    assert ranges(False) == []
