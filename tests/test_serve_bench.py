"""Tests of `tp-runtime serve-bench` on the CPU: arrivals (seeded lengths, Poisson rate, the closed loop's cap),
metrics against hand-made timestamps, the per-rank loop's idle wait on a real Worker, runs of
configs/serve_tiny.yaml (tp 1 and tp 2 under the local launcher give the same requests, order and token counts;
embedded Ray), and every refusal (exit 2, one `error:` line, nothing started). GPU: test_serve_bench_gpu.py.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch

from conftest import REPO, assert_refused, last_json, run_cli

from tp_runtime.cli import main as cli_main
from tp_runtime.config import ConfigError, load_config
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.worker import Worker
from tp_runtime.parallel.group import single_process
from tp_runtime.serving.arrivals import (Arrival, ClosedLoop, OpenLoop, ServeRequest, dataset_requests,
                                         draw_requests, parse_length, poisson_offsets, read_dataset)
from tp_runtime.serving.config import load_serve
from tp_runtime.serving.entry import round_order
from tp_runtime.serving.source import Setting, run_setting
from tp_runtime.serving.metrics import Goodput, RequestTrace, over_rounds, setting_metrics

SERVE_TINY = "configs/serve_tiny.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A short run of serve_tiny: one closed-loop concurrency, one Poisson rate, two modes, two rounds.
SHORT = ["grid.modes=[breakable-narrow,full_and_breakable]", "grid.concurrency=[2]", "grid.rate=[40.0]",
         "serve.requests=6", "serve.repeats=2", "serve.warmup_requests=1", "serve.warmup_per_client=1",
         "serve.goodput={ttft_ms: 1.0e9, e2el_ms: 1.0e9}"]


# ------------------------------------------------------------------ arrivals


def test_poisson_offsets_match_the_rate():
    """n = 20000 arrivals at 40/s: the rate estimated from the span, (n - 1) / last offset, is within 3 % of 40
    (the span is a sum of n - 1 exponential gaps: relative std 1 / sqrt(n - 1) = 0.71 %, so 3 % is 4.2 sigma),
    and the gaps' coefficient of variation is that of an exponential, 1, within 0.05 (its standard error here
    is about sqrt(2 / n) = 0.01: 5 sigma; evenly spaced or uniform gaps would give 0 or 0.58)."""
    n, rate = 20000, 40.0
    t = poisson_offsets(n, rate, seed=3)
    assert t[0] == 0.0 and all(b > a for a, b in zip(t, t[1:]))
    assert abs((n - 1) / t[-1] / rate - 1) < 0.03
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert abs(statistics.pstdev(gaps) / statistics.fmean(gaps) - 1) < 0.05
    assert poisson_offsets(50, rate, seed=3) == t[:50]  # same seed, same arrivals
    assert poisson_offsets(50, rate, seed=4) != t[:50]
    # Every rate scales the same standard gaps: a rate twice as high arrives in half the time.
    assert poisson_offsets(50, 2 * rate, seed=3) == pytest.approx([x / 2 for x in t[:50]], rel=1e-12)


def test_length_distributions_are_seeded_and_bounded():
    src = "test"
    fixed, uniform = parse_length(7, "p", src), parse_length([3, 9], "p", src)
    normal = parse_length({"dist": "normal", "mean": 100, "std": 10, "max": 140}, "p", src)
    lognormal = parse_length({"dist": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 4000}, "p", src)
    rng = random.Random(0)
    assert {fixed.draw(rng) for _ in range(50)} == {7}
    draws = [uniform.draw(rng) for _ in range(2000)]
    assert set(draws) == set(range(3, 10))  # every value of [3, 9], nothing outside
    # n = 2000: the mean of the normal has std 10 / sqrt(2000) = 0.22 (tolerance 1.5: 6.7 sigma; rounding to an
    # int is symmetric, the clip at 140 = 4 sigma removes a negligible tail); the lognormal's sample median has
    # std about 1.25 * 0.5 / sqrt(2000) = 1.4 % in log space (tolerance 5 %: 3.5 sigma).
    ns = [normal.draw(rng) for _ in range(2000)]
    assert all(1 <= x <= 140 for x in ns) and abs(statistics.fmean(ns) - 100) < 1.5
    ls = [lognormal.draw(rng) for _ in range(2000)]
    assert all(16 <= x <= 4000 for x in ls) and abs(statistics.median(ls) / 200 - 1) < 0.05
    assert normal.hi == 140 and parse_length({"dist": "normal", "mean": 100, "std": 10}, "p", src).hi == 140
    a, b = draw_requests(uniform, normal, 30, seed=1), draw_requests(uniform, normal, 30, seed=1)
    assert a == b and [r.id for r in a] == list(range(30))
    assert draw_requests(uniform, normal, 30, seed=2) != a
    # Prompt and output lengths draw from their own streams: changing one leaves the other alone.
    assert [r.prompt_len for r in draw_requests(uniform, fixed, 30, seed=1)] == [r.prompt_len for r in a]


def test_dataset_rows_order_and_cycle(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt_len": 5, "output_len": 2, "text": "ignored"}\n\n{"prompt_len": 9, "output_len": 1}\n'
                 '{"prompt_len": 3, "output_len": 4}\n')
    rows = read_dataset(str(f), max_len=64)
    assert rows == [(5, 2), (9, 1), (3, 4)]
    reqs = dataset_requests(rows, 7, seed=0)
    assert reqs == dataset_requests(rows, 7, seed=0) and [r.id for r in reqs] == list(range(7))
    first = [(r.prompt_len, r.output_len) for r in reqs[:3]]
    assert sorted(first) == sorted(rows)  # a seeded order of every row, then cycled
    assert [(r.prompt_len, r.output_len) for r in reqs[3:6]] == first


def test_dataset_line_with_a_key_twice_is_refused_naming_file_and_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt_len": 5, "output_len": 2}\n{"prompt_len": 9, "output_len": 1, "prompt_len": 90}\n')
    with pytest.raises(ConfigError, match=rf"{f}:2: key 'prompt_len' is given twice"):
        read_dataset(str(f), max_len=64)
    f.write_text('{"prompt_len": 5, "output_len": 2, "x": ' + "[" * 3000 + "]" * 3000 + "}\n")
    with pytest.raises(ConfigError, match=rf"{f}:1: JSON nested too deeply"):
        read_dataset(str(f), max_len=64)


def test_closed_loop_never_exceeds_its_clients():
    """Three clients over ten requests, finishing in a random order: at most three outstanding at any time,
    every request sent once in order, each successor arriving at the end of its predecessor's last step."""
    reqs = [ServeRequest(i, 4, 2) for i in range(10)]
    loop, rng = ClosedLoop(reqs, 3), random.Random(5)
    sent, live, step = [], [], 0
    while len(sent) < 10 or live:
        for req, arrival in loop.due(0.0):
            assert arrival == (Arrival(0.0) if req.id < 3 else Arrival(after_step=step - 1))
            sent.append(req.id)
            live.append(req.id)
        assert len(live) == loop.outstanding <= 3
        done = [live.pop(rng.randrange(len(live)))]  # one request finishes in this step
        loop.finished(done, step)
        step += 1
    assert sent == list(range(10)) and loop.next_at() is None


def test_open_loop_admits_by_arrival_time():
    reqs = [ServeRequest(i, 4, 2) for i in range(3)]
    loop = OpenLoop(reqs, [0.0, 0.5, 0.5])
    assert [r.id for r, _ in loop.due(0.1)] == [0] and loop.next_at() == 0.5
    assert loop.due(0.49) == [] and [r.id for r, a in loop.due(0.5)] == [1, 2] and loop.next_at() is None


def test_rounds_rotate_the_modes_of_each_load():
    settings = [{"mode": m, "load": load} for load in ("c1", "c4") for m in "ABC"]
    orders = [[s["mode"] for s in round_order(settings, r, 3)] for r in range(3)]
    assert orders == [list("ABCABC"), list("BCABCA"), list("CABCAB")]
    assert [[s["load"] for s in round_order(settings, r, 3)] for r in range(3)] == [["c1"] * 3 + ["c4"] * 3] * 3


# ------------------------------------------------------------------ metrics


def test_metrics_from_hand_made_timestamps():
    a = RequestTrace(0, prompt_len=10, output_len=3, arrival_s=0.0, token_s=[0.1, 0.15, 0.25])
    b = RequestTrace(1, prompt_len=6, output_len=1, arrival_s=0.05, token_s=[0.2])
    c = RequestTrace(2, prompt_len=4, output_len=2, arrival_s=0.1, token_s=[0.3])  # did not finish
    m = setting_metrics([a, b, c])
    assert (m["requests"], m["completed"], m["output_tokens"], m["prompt_tokens"]) == (3, 2, 4, 16)
    assert m["duration_s"] == pytest.approx(0.25)
    assert m["request_throughput"] == pytest.approx(8.0) and m["output_throughput"] == pytest.approx(16.0)
    assert m["total_token_throughput"] == pytest.approx(80.0)
    assert m["ttft_ms_mean"] == pytest.approx(125.0)  # 100 and 150 ms
    assert m["ttft_ms_p50"] == pytest.approx(125.0) and m["ttft_ms_p90"] == pytest.approx(145.0)
    assert m["tpot_ms_p50"] == pytest.approx(75.0) and m["tpot_ms_p99"] == pytest.approx(75.0)  # (250-100)/2
    assert m["itl_ms_mean"] == pytest.approx(75.0) and m["itl_ms_p99"] == pytest.approx(99.5)  # gaps 50, 100
    assert m["e2el_ms_p50"] == pytest.approx(200.0)  # 250 and 150 ms
    empty = setting_metrics([c])
    assert empty["completed"] == 0 and empty["ttft_ms_p50"] is None and empty["output_throughput"] is None
    assert m["goodput"] is None and empty["output_throughput_per_user"] is None  # no limits given; no TPOT


def test_goodput_and_throughput_per_gpu_and_user():
    # TTFT 100 / 150 / 50 ms, TPOT 75 / none (one token) / 20 ms, E2EL 250 / 150 / 70 ms; duration 0.25 s.
    a = RequestTrace(0, prompt_len=10, output_len=3, arrival_s=0.0, token_s=[0.1, 0.15, 0.25])
    b = RequestTrace(1, prompt_len=6, output_len=1, arrival_s=0.05, token_s=[0.2])
    c = RequestTrace(2, prompt_len=4, output_len=2, arrival_s=0.1, token_s=[0.15, 0.17])
    good = {(("ttft_ms", 120.0),): 2, (("tpot_ms", 50.0),): 2,  # b has no TPOT: within any TPOT limit
            (("ttft_ms", 120.0), ("tpot_ms", 50.0)): 1, (("e2el_ms", 160.0),): 2, (("e2el_ms", 140.0),): 1,
            (("ttft_ms", 200.0), ("tpot_ms", 80.0), ("e2el_ms", 300.0)): 3}
    for limits, n in good.items():
        m = setting_metrics([a, b, c], Goodput(**dict(limits)), gpus=4)
        assert m["good_requests"] == n and m["goodput"] == pytest.approx(n / 0.25), limits
    assert m["output_throughput_per_gpu"] == pytest.approx(m["output_throughput"] / 4) == pytest.approx(6.0)
    assert m["tpot_ms_p50"] == pytest.approx(47.5)  # of 75 and 20 ms
    assert m["output_throughput_per_user"] == pytest.approx(1e3 / 47.5)


def test_over_rounds_medians_and_spread():
    rounds = [{"completed": 4, "output_throughput": t, "ttft_ms_p50": f, "tpot_ms_p50": None}
              for t, f in ((10.0, 3.0), (30.0, 1.0), (20.0, 2.0))]
    o = over_rounds(rounds)
    assert o["completed"] == 4 and isinstance(o["completed"], int)
    assert o["output_throughput"] == 20.0 and o["ttft_ms_p50"] == 2.0 and o["tpot_ms_p50"] is None
    assert o["spread"]["output_throughput"] == [10.0, 30.0] and o["per_round"]["ttft_ms_p50"] == [3.0, 1.0, 2.0]
    assert o["rounds"] == 3


# ------------------------------------------------------------------ the loop on a real Worker


def test_loop_waits_idle_until_an_arrival():
    """tp 1, a real Worker on the CPU: request 1 arrives 0.6 s after request 0, long after request 0 finished.
    The loop idles (an IDLE message) instead of stepping, so request 1's first token comes after its arrival,
    within a few steps of it; every request emits exactly its output tokens, in increasing time order."""
    cfg = load_config(REPO / "configs/tiny.yaml", ["parallel.tp=1", "model.layers=1-2"])
    w = Worker(cfg, single_process(torch.device("cpu")))
    reqs = [ServeRequest(0, 8, 3), ServeRequest(1, 12, 2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every rank the tests launch (conftest.child_env): steps of milliseconds
    try:
        inputs = Workload([], cfg.model.hidden_size, seed=0)
        run_setting(w, w.tp, Setting(reqs, concurrency=2), inputs, in_flight=2)  # warm-up: first calls are slow
        res = run_setting(w, w.tp, Setting(reqs, offsets=[0.0, 0.6]), inputs, in_flight=2)
    finally:
        torch.set_num_threads(threads)
    a, b = res.traces
    assert res.idle_waits >= 1 and res.order == [0, 1]
    assert [len(t.token_s) for t in res.traces] == [3, 2] and all(t.complete for t in res.traces)
    assert a.token_s[-1] < 0.6 == b.arrival_s < b.token_s[0] < 0.6 + 0.5  # a step or two, not another gap
    assert all(x < y for t in res.traces for x, y in zip(t.token_s, t.token_s[1:]))
    assert res.steps == 5 and res.decode_steps == 3  # two prefills, then 2 + 1 decodes, none shared
    assert res.outputs_finite and res.max_running == 1


# ------------------------------------------------------------------ runs


def _rounds(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def _identity(rounds: list[dict]) -> list[tuple]:
    """What must not change between runs of one seed: requests, admission order, token counts."""
    return [(r["round"], r["mode"], r["label"], r["request_digest"], r["order_digest"], tuple(r["order_head"]),
             r["metrics"]["requests"], r["metrics"]["completed"], r["metrics"]["prompt_tokens"],
             r["metrics"]["output_tokens"]) for r in rounds]


@pytest.fixture(scope="module")
def tp1_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve")
    r = run_cli(["serve-bench", SERVE_TINY, *SHORT, f"serve.output={out}"], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, out / "serve_tiny"


def test_tiny_run_records_and_outputs(tp1_run):
    r, out = tp1_run
    summ = last_json(r.stdout)
    assert summ["command"] == "serve-bench" and summ["settings"] == 4 and summ["rounds"] == 2
    assert summ["all_completed"] and summ["all_outputs_finite"] and summ["plots"] == "written"
    assert summ["loads"] == ["c=2", "rate=40/s"] and summ["modes"] == ["breakable-narrow", "full_and_breakable"]
    assert "TTFT p50" in r.stdout and r.stderr.count("serve-bench serve_tiny") >= 1  # the table; tqdm on stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"kind": "setting"')]
    settings = [json.loads(x) for x in (out / "settings.jsonl").read_text().splitlines()]
    assert lines == settings and len(settings) == 4
    for s in settings:
        assert s["completed"] == s["requests"] == 6 and s["same_requests_every_round"] and s["rounds"] == 2
        for name in ("ttft", "tpot", "itl", "e2el"):
            p50, p90, p99 = (s[f"{name}_ms_p{p}"] for p in (50, 90, 99))
            assert s[f"{name}_ms_mean"] > 0 and 0 < p50 <= p90 <= p99, (name, s)
        assert s["output_throughput"] > 0 and s["duration_s"] > 0
        # One client-round of untimed requests before each concurrency setting; the loose limits pass everyone.
        assert s["warmup_requests"] == (2 if s["load"] == "concurrency" else 0)
        assert s["goodput_limits_ms"] == {"ttft": 1.0e9, "e2el": 1.0e9} and s["good_requests"] == 6
        assert s["goodput"] == pytest.approx(s["request_throughput"])
        assert s["output_throughput_per_gpu"] == pytest.approx(s["output_throughput"])  # tp 1: one rank
        lo, hi = s["spread"]["output_throughput"]
        assert lo <= s["output_throughput"] <= hi and len(s["per_round"]["output_throughput"]) == 2
        assert s["max_running"] <= (2 if s["load"] == "concurrency" else 4)  # clients, or runtime.max_seqs
        assert s["steps_by_path"].get("eager", 0) + s["steps_by_path"].get("full", 0) == s["steps"]  # CPU: no graphs
    rounds = _rounds(out)
    for rec in rounds:  # throughputs are the counts over the duration, as measured
        m = rec["metrics"]
        assert m["output_throughput"] == pytest.approx(m["output_tokens"] / m["duration_s"])
        assert m["output_throughput_per_user"] == pytest.approx(1e3 / m["tpot_ms_p50"])  # a round's own TPOT
        assert m["ttft_ms_p50"] <= m["e2el_ms_p50"]
    # Round 2 runs the modes of each load in the other order.
    by_round = [[x["mode"] for x in rounds if x["round"] == k] for k in (0, 1)]
    assert by_round[0] == ["breakable-narrow", "full_and_breakable"] * 2 and by_round[1] == by_round[0][::-1]
    for name in ("ttft_vs_throughput.png", "tpot_vs_throughput.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert json.loads((out / "summary.json").read_text()) == summ


def test_tp2_local_gives_the_same_requests_order_and_tokens(tp1_run, tmp_path):
    """The same config and seed at tp 2 under the local launcher (the elastic agent's two processes): the same
    request lists (lengths and Poisson offsets), admission order and token counts as the tp 1 run, round by round."""
    _, out1 = tp1_run
    r = run_cli(["serve-bench", SERVE_TINY, *SHORT, "parallel.tp=2", "serve.plots=false", f"serve.output={tmp_path}"],
                timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    summ = last_json(r.stdout)
    assert summ["tp"] == 2 and summ["launcher"] == "local" and summ["all_completed"]
    assert _identity(_rounds(tmp_path / "serve_tiny")) == _identity(_rounds(out1))


def test_tiny_run_under_embedded_ray(tmp_path):
    r = run_cli(["serve-bench", SERVE_TINY, "parallel.tp=2", "parallel.launcher=ray", "grid.modes=[full_and_breakable]",
                 "grid.concurrency=[2]", "grid.rate=[]", "serve.requests=3", "serve.repeats=1",
                 "serve.warmup_requests=0", "serve.plots=false", f"serve.output={tmp_path}"], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    summ = last_json(r.stdout)
    assert summ["launcher"] == "ray" and summ["tp"] == 2 and summ["all_completed"] and summ["settings"] == 1


# ------------------------------------------------------------------ refusals


def _refused(capsys, tmp_path, *words: str) -> str:
    """serve-bench refused in this process before anything started: exit 2, nothing on stdout, one `error:`
    line, no output directory made."""
    out = tmp_path / "out"
    rc = cli_main(["serve-bench", str(REPO / SERVE_TINY), *words, f"serve.output={out}"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and captured.out == "" and len(lines) == 1 and lines[0].startswith("error: "), captured
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("word, needles", [
    ("grid.rate=[0]", ["grid 'rate' holds 0", "> 0"]),
    ("grid.rate=[-2.5]", ["grid 'rate' holds -2.5"]),
    ("grid.rate=[.inf]", ["grid 'rate' holds inf", "finite"]),
    ("grid.rate=[.nan]", ["grid 'rate' holds nan"]),
    ("serve.output_len=480", ["'serve.prompt_len' up to 40", "'serve.output_len' up to 480", "runtime.max_len=512"]),
    ("serve.prompt_len={dist: lognormal, median: 100, sigma: 1.0}", ["serve.prompt_len", "runtime.max_len=512"]),
    ("grid.concurrency=[1, 5]", ["grid 'concurrency' holds 5", "runtime.max_seqs=4"]),
    ("grid.concurrency=[0]", ["grid 'concurrency' holds 0"]),
    ("serve.foo=1", ["unknown key 'serve.foo'"]),
    ("grid.batch=[1]", ["unknown grid key 'batch'"]),
    ("servee.requests=1", ["unknown key 'servee.requests'"]),
    ("serve.prompt_len={dist: normal, mean: 10, std: 2, maxx: 20}", ["unknown key 'serve.prompt_len.maxx'"]),
    ("grid.modes=[full@fp8]", ["grid 'modes' holds ['full@fp8']"]),
    ("serve.repeats=0", ["'serve.repeats' must be >= 1"]),
    ("serve.warmup_per_client=-1", ["'serve.warmup_per_client' must be >= 0"]),
    ("serve.goodput={}", ["'serve.goodput' needs at least one of ttft_ms, tpot_ms, e2el_ms"]),
    ("serve.goodput={ttft_ms: 0}", ["'serve.goodput.ttft_ms' must be a finite number of ms > 0"]),
    ("serve.goodput={tpot_ms: .inf}", ["'serve.goodput.tpot_ms' must be a finite number of ms > 0"]),
    ("serve.goodput={ttft: 10}", ["unknown key 'serve.goodput.ttft'"]),
    ("parallel.launcher=torchrun", ["parallel.launcher=torchrun", "-m tp_runtime.serving"]),
])
def test_bad_settings_are_refused(capsys, tmp_path, word, needles):
    line = _refused(capsys, tmp_path, word)
    for needle in needles:
        assert needle in line, line


@pytest.mark.parametrize("text, needle", [
    ("", "is empty"),
    ("\n  \n", "is empty"),
    ('{"prompt_len": 8, "output_len": 4}\n{"prompt_len": 8, "output_len": 4\n', ":2: not JSON"),
    ('{"prompt_len": 8, "output_len": 4}\n\n[8, 4]\n', ":3: must be a JSON object"),
    ('{"prompt_len": 8}\n', ":1: missing 'output_len'"),
    ('{"prompt_len": 8, "output_len": 0}\n', ":1: 'output_len' must be an integer >= 1"),
    ('{"prompt_len": 500, "output_len": 13}\n', ":1: prompt_len + output_len = 500 + 13 = 513 exceeds "
                                              "runtime.max_len=512"),
])
def test_bad_dataset_is_refused_with_file_and_line(capsys, tmp_path, text, needle):
    f = tmp_path / "requests.jsonl"
    f.write_text(text)
    line = _refused(capsys, tmp_path, f"serve.dataset={f}")
    assert str(f) in line and needle in line, line


def test_bad_config_file_is_refused(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {REPO / 'configs/tiny.yaml'}\ngrid: {{concurrency: [1]}}\nserving: {{}}\n")
    assert cli_main(["serve-bench", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'serving'" in err and str(bad) in err
    with pytest.raises(ConfigError, match="needs 'concurrency'"):
        load_serve(REPO / SERVE_TINY, ["grid.concurrency=[]", "grid.rate=[]"])


def test_refusal_through_the_command_line():
    """As a user runs it: one `error:` line, exit 2, no traceback, no process left behind."""
    r = run_cli(["serve-bench", SERVE_TINY, "grid.rate=[0.0]"], timeout_s=60)
    assert_refused(r, "grid 'rate' holds 0.0")


def test_dsv4_protocol_config():
    # configs/serve_flash_8k1k.yaml: prompts of 8,192 tokens, 1,024 output tokens, concurrency 1 to 64, a warm-up
    # of twice the concurrency before each, goodput limits; 9,216 positions fit runtime.max_len.
    sc = load_serve("configs/serve_flash_8k1k.yaml")
    assert sc.prompt.describe() == {"dist": "fixed", "min": 8192, "max": 8192}
    assert sc.output.describe() == {"dist": "fixed", "min": 1024, "max": 1024}
    assert [int(load.value) for load in sc.loads] == [1, 2, 4, 8, 16, 32, 64]
    assert [sc.serve.warmup_for(load) for load in sc.loads] == [2, 4, 8, 16, 32, 64, 128]
    assert sc.serve.goodput.limits() == {"ttft": 10000.0, "tpot": 50.0}
    assert sc.worker_config(sc.modes[0]).runtime.max_len >= 8192 + 1024


def test_dotted_words_set_one_key_of_a_serve_mapping():
    sc = load_serve("configs/serve_flash_8k1k.yaml", ["serve.goodput.ttft_ms=500", "serve.goodput.e2el_ms=9000"])
    assert sc.serve.goodput.limits() == {"ttft": 500.0, "tpot": 50.0, "e2el": 9000.0}
    sc = load_serve(SERVE_TINY, ["serve.prompt_len.max=30"])
    assert sc.prompt.describe() == {"dist": "uniform", "min": 8, "max": 30}
    with pytest.raises(ConfigError, match="'serve.output_len.max' descends into 'output_len', which is not a section"):
        load_serve("configs/serve_flash_8k1k.yaml", ["serve.output_len.max=30"])
