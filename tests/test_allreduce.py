"""parallel.allreduce on the CPU: the key's validation, the selection as a pure function (every fallback and
its reason), real two-process gloo runs (auto picks gloo, the report names it, outputs unchanged; an explicit
symm_* value is refused), the failure bounds (fail_rank, the heartbeat watch, the bounded drain) and the
bench's all-reduce lanes. The symmetric-memory kernels themselves: tests/test_allreduce_gpu.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from conftest import REPO, STOP, STOP_TIMEOUT_S, TINY, TINY_PATH, child_env, free_port, last_json, run_cli, stopped_at

from tp_runtime.bench.comparisons import allreduce_pairs
from tp_runtime.bench.lanes import Lane, Seqs, shard_key
from tp_runtime.bench.sweep_config import load_sweep, split_mode
from tp_runtime.config import ConfigError, load_config
from tp_runtime.parallel.allreduce import (AllReduceError, Facts, choose, decide, route,
                                           setup_allreduce, threshold_from)
from tp_runtime.parallel.group import single_process
from tp_runtime.parallel.heartbeat import Heartbeat

KB = 1 << 10
GOOD = dict(backend="nccl", world=2, nodes=1, peer_access=True, symm_missing=None)


# ---------------------------------------------------------------- the key


def test_bad_value_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"'parallel\.allreduce' must be one of \['auto', 'nccl', 'symm_one_shot', "
                                          r"'symm_two_shot'\], got 'fast'"):
        load_config(TINY_PATH, ["parallel.allreduce=fast"])


def test_symm_on_a_cpu_device_is_refused_before_any_rank_starts():
    with pytest.raises(ConfigError, match=r"override 'parallel\.allreduce=symm_one_shot'.*'parallel\.allreduce'="
                                          r"symm_one_shot needs CUDA GPUs"):
        load_config(TINY_PATH, ["runtime.device=cpu", "parallel.allreduce=symm_one_shot"])
    assert load_config(TINY_PATH, ["runtime.device=cpu", "parallel.allreduce=nccl"]).parallel.allreduce == "nccl"


# ---------------------------------------------------------------- the selection, a pure function


@pytest.mark.parametrize("change, words", [
    (dict(backend="gloo"), "the device backend is gloo (CPU ranks)"),
    (dict(nodes=2), "span more than one node (LOCAL_WORLD_SIZE != WORLD_SIZE)"),
    (dict(nodes=None), "did not set LOCAL_WORLD_SIZE"),
    (dict(peer_access=False), "lack peer access"),
    (dict(symm_missing="rank 1: missing one_shot_all_reduce_out"), "lacks symmetric memory: rank 1: missing"),
])
def test_every_fallback_and_its_reason(change, words):
    facts = {**GOOD, **change}
    path, reason = choose("auto", **facts, threshold_bytes=64 * KB, nbytes=8 * KB)
    assert path == facts["backend"] and words in reason and reason.startswith("parallel.allreduce=auto")
    for explicit in ("symm_one_shot", "symm_two_shot"):  # an explicit symm value is refused, naming key and reason
        with pytest.raises(AllReduceError, match=rf"'parallel\.allreduce'={explicit} cannot run here: .*"
                                                 rf"{words.split('(')[0].strip()}"):
            choose(explicit, **facts, threshold_bytes=64 * KB, nbytes=8 * KB)
    assert choose("nccl", **facts, threshold_bytes=64 * KB, nbytes=8 * KB)[0] == facts["backend"]


def test_tp1_has_nothing_to_reduce_whatever_is_asked():
    for asked in ("auto", "nccl", "symm_one_shot", "symm_two_shot"):
        assert choose(asked, **{**GOOD, "world": 1, "backend": "gloo"}, threshold_bytes=0, nbytes=8 * KB) == (
            "none", "tp = 1: nothing to reduce")


def test_auto_takes_one_shot_below_the_threshold_and_nccl_above():
    assert choose("auto", **GOOD, threshold_bytes=64 * KB, nbytes=64 * KB)[0] == "symm_one_shot"
    assert choose("auto", **GOOD, threshold_bytes=64 * KB, nbytes=64 * KB + 16)[0] == "nccl"
    assert choose("auto", **GOOD, threshold_bytes=0, nbytes=16)[0] == "nccl"  # one-shot lost everywhere
    assert choose("symm_two_shot", **GOOD, threshold_bytes=4 << 20, nbytes=1 << 20)[0] == "symm_two_shot"
    assert choose("nccl", **GOOD, threshold_bytes=4 << 20, nbytes=8 * KB)[0] == "nccl"


def test_messages_the_kernels_do_not_take_go_to_nccl():
    assert route("symm_one_shot", 64 * KB, 8 * KB, torch.float32) == "symm_one_shot"
    assert route("symm_one_shot", 64 * KB, 8 * KB + 2, torch.bfloat16) == "nccl"  # not a multiple of 16 bytes
    assert route("symm_one_shot", 64 * KB, 8 * KB, torch.float16) == "nccl"  # the kernels reduce bf16 / fp32
    assert route("symm_one_shot", 64 * KB, 8 * KB, torch.float64) == "nccl"
    assert route("symm_one_shot", 64 * KB, 8 * KB, torch.bfloat16, dense=False) == "nccl"
    assert route("symm_one_shot", 64 * KB, 0, torch.bfloat16) == "nccl"
    assert route("gloo", 64 * KB, 8 * KB, torch.float32) == "gloo"


def test_a_view_off_the_16_byte_grid_goes_to_nccl():
    from tp_runtime.parallel.allreduce import AllReduce

    ar = AllReduce("symm_one_shot", "symm_one_shot", "test", threshold_bytes=64 * KB, world=2)
    base = torch.zeros(1024)
    assert ar.route(base[4:516]) == "symm_one_shot"  # starts 16 bytes in
    assert ar.route(base[1:513]) == "nccl"  # starts 4 bytes in: the kernels' vector access would fault
    assert ar.route(base.view(32, 32)[:, :16]) == "nccl"  # not contiguous


def test_the_threshold_is_where_one_shot_stops_winning():
    t = lambda *pairs: {s: {"symm": a, "nccl": b} for s, (a, b) in zip((8 * KB, 32 * KB, 128 * KB), pairs)}
    assert threshold_from(t((3, 11), (4, 12), (20, 14)), cap=1 << 20) == 32 * KB
    assert threshold_from(t((3, 11), (4, 12), (5, 14)), cap=1 << 20) == 1 << 20  # won everywhere: the whole buffer
    assert threshold_from(t((12, 11), (4, 12), (5, 14)), cap=1 << 20) == 0  # lost at the smallest: NCCL for all
    assert threshold_from(t((3, 11), (13, 12), (5, 14)), cap=1 << 20) == 8 * KB  # a win past a loss does not count


def test_unknown_value_is_refused_by_decide_too():
    with pytest.raises(AllReduceError, match="'parallel.allreduce' must be one of"):
        decide("fast", Facts(**GOOD))


def test_tp1_group_gets_a_strategy_without_collectives():
    tp = setup_allreduce(single_process(torch.device("cpu")), "symm_one_shot", 1 << 20, torch.float32)
    assert tp.allreduce.path == "none" and not tp.allreduce.uses_symm
    x = torch.ones(4)
    assert tp.all_reduce(x) is x and torch.equal(x, torch.ones(4))
    assert tp.allreduce.describe()["allreduce"] == "none"


# ---------------------------------------------------------------- real processes (gloo)


def test_auto_on_gloo_picks_the_fallback_names_it_and_changes_no_output(local_checksum, local_run):
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.allreduce=nccl"], timeout_s=300)
    assert r.returncode == 0, r.stderr[-3000:]
    forced = last_json(r.stdout)
    assert forced["allreduce"] == "gloo" and forced["allreduce_requested"] == "nccl"
    assert forced["output_checksum"] == local_checksum  # the default (auto) run: the same sums, in the same order
    # the default run (`run configs/tiny.yaml parallel.launcher=local`, made once for the suite)
    rec = last_json(local_run["stdout"])
    assert rec["allreduce"] == "gloo" and rec["allreduce_requested"] == "auto" and rec["allreduce_buffer_bytes"] == 0
    assert "the device backend is gloo" in rec["allreduce_reason"]
    assert "all-reduce: gloo (parallel.allreduce=auto" in local_run["stdout"]  # the report's line
    assert local_run["stderr"].count("tp_runtime: all-reduce:") == 1  # logged once, by rank 0


def test_symm_one_shot_on_cpu_ranks_is_a_clear_error():
    # on a machine without GPUs: refused before any rank starts, naming the key (a rank once found it out)
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.allreduce=symm_one_shot"], timeout_s=300)
    assert r.returncode == 2, r.stderr[-3000:]
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error:") and "'parallel.allreduce'=symm_one_shot needs CUDA GPUs" in err, err
    r = run_cli(["run", TINY, "parallel.launcher=local", "runtime.device=cpu", "parallel.allreduce=symm_two_shot"],
                timeout_s=120)
    assert r.returncode == 2 and "error:" in r.stderr and "'parallel.allreduce'=symm_two_shot needs CUDA" in r.stderr


def test_a_killed_rank_still_ends_the_run_in_bounded_time():
    t0 = time.monotonic()
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.allreduce=auto", "parallel.fail_rank=1",
                 "parallel.fail_step=5"], timeout_s=120)
    assert r.returncode == 1 and "error: rank 1 failed (exit code -9)" in r.stderr, r.stderr[-3000:]
    assert time.monotonic() - t0 < 60


def test_a_stopped_rank_is_named_within_the_timeout():
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.allreduce=auto", "parallel.fail_rank=1", *STOP],
                timeout_s=120)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "rank 1 (host " in r.stderr and "stopped answering" in r.stderr, r.stderr[-3000:]
    after = r.ended - stopped_at(r.stderr, 1)
    assert STOP_TIMEOUT_S - 1 < after < STOP_TIMEOUT_S + 10, after


# ---------------------------------------------------------------- the bounds' mechanisms, in process


def _store_pair() -> tuple[dist.TCPStore, dist.TCPStore]:
    """A two-rank rendezvous store on loopback: the server (rank 0's side) and one client (rank 1's)."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=10), wait_for_workers=False)
    return server, dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))


def test_heartbeat_watch_acts_once_a_peer_is_silent_for_the_limit():
    server, client = _store_pair()
    me, peer = Heartbeat(server, 0, 2, 0.05, None), Heartbeat(client, 1, 2, 0.05, None)
    fired: list[tuple[float, list]] = []
    me.watch(0.5, lambda lost: fired.append((time.monotonic(), lost)))
    try:
        time.sleep(1.0)
        assert not fired  # both beating: nothing happens
        peer.stop()  # rank 1 goes silent
        t0 = time.monotonic()
        deadline = t0 + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(fired) == 1 and [s.rank for s in fired[0][1]] == [1]
        # silent since its last seen beat (up to two periods before the stop): the limit, give or take periods
        assert 0.5 - 0.15 <= fired[0][0] - t0 < 0.5 + 0.5
        time.sleep(0.3)
        assert len(fired) == 1  # once
    finally:
        me.stop()
        peer.stop()


def test_heartbeat_learns_its_peers_at_start_not_only_in_its_loop():
    # A peer that stops within the loop's first period must still be named by host and pid: rank 0's
    # loop looks once (no peer yet) and then sleeps 30 s; learn_peers reads the identity at once.
    server, client = _store_pair()
    me = Heartbeat(server, 0, 2, 30.0, None)
    deadline = time.monotonic() + 5
    while 1 not in me._count and time.monotonic() < deadline:  # its first look is done
        time.sleep(0.01)
    peer = Heartbeat(client, 1, 2, 30.0, None)
    try:
        assert me._silent(1, 1.0).describe() == "rank 1"  # the loop has not seen it
        me.learn_peers(2.0)
        assert me._silent(1, 1.0).describe() == f"rank 1 (host {socket.gethostname()}, pid {os.getpid()})"
    finally:
        me.stop()
        peer.stop()


def test_heartbeat_watch_ignores_a_peer_that_finished_its_run():
    server, client = _store_pair()
    me, peer = Heartbeat(server, 0, 2, 0.05, None), Heartbeat(client, 1, 2, 0.05, None)
    fired = []
    me.watch(0.3, fired.append)
    try:
        time.sleep(0.3)
        peer.finish()  # rank 1 is done while rank 0 still writes its results
        time.sleep(1.0)
        assert not fired
    finally:
        me.stop()
        peer.stop()


DRAIN = """
import time, torch
from tp_runtime.parallel.allreduce import AllReduce
from tp_runtime.parallel.group import TPGroup, _drain_guard
ar = AllReduce("symm_one_shot", "symm_one_shot", "test", buffer=torch.zeros(16, dtype=torch.uint8), drain_s=0.5)
_drain_guard(TPGroup(rank=0, size=2, device=torch.device("cpu"), allreduce=ar))
time.sleep(30)  # a device that never drains
"""


def test_shutdown_gives_up_on_a_device_that_does_not_drain():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", DRAIN], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "did not drain within 0.5 s" in r.stderr, r.stderr[-2000:]
    assert time.monotonic() - t0 < 20


# ---------------------------------------------------------------- bench lanes


def test_allreduce_lane_words_and_their_comparison():
    assert split_mode("full@fp8+triton+nccl") == ("full", {"weight_format": "fp8", "kernels": "triton",
                                                            "allreduce": "nccl"})
    lane = lambda mode, baseline=False: Lane(("tp1:" if baseline else "") + mode, mode, None, Seqs(), baseline)
    lanes = [lane("full@triton"), lane("full@triton+nccl"), lane("full"), lane("full@triton", True),
             lane("full@triton+nccl", True)]
    assert allreduce_pairs(lanes) == [("allreduce_vs_nccl", "full@triton", "full@triton+nccl")]


def test_a_tp2_sweep_with_an_nccl_lane_records_and_compares_the_all_reduce(tmp_path):
    r = run_cli(["bench", "configs/bench_tiny.yaml", "grid.parallel.tp=[2]", "grid.bench.batch=[2]",
                 "grid.bench.context=[12]", "grid.modes=[eager,eager@nccl]", "bench.prefill_check=false",
                 f"bench.output={tmp_path}"], timeout_s=300)
    assert r.returncode == 0, r.stderr[-3000:]
    points = [json.loads(line) for line in (tmp_path / "tiny" / "points.jsonl").read_text().splitlines()]
    comps = [json.loads(line) for line in (tmp_path / "tiny" / "comparisons.jsonl").read_text().splitlines()]
    assert {(p["mode"], p["allreduce"], p["allreduce_requested"]) for p in points} == {
        ("eager", "gloo", "auto"), ("eager@nccl", "gloo", "nccl")}
    assert all(p["allreduce_ms_path"] == "gloo" and p["allreduce_ms_eager"] > 0 for p in points)
    assert [(c["variant_lane"], c["baseline"]) for c in comps if c["what"] == "allreduce_vs_nccl"] == [
        ("eager", "eager@nccl")]
    sweep = load_sweep(REPO / "configs" / "bench_tiny.yaml", ["grid.modes=[eager,eager@nccl]"])
    assert sweep.worker_config(2, sweep.variants()[0], "eager@nccl").parallel.allreduce == "nccl"


def test_allreduce_lanes_get_their_own_shard_at_tp_above_1_only():
    auto, nccl = (load_config(TINY_PATH, [f"parallel.allreduce={v}"]) for v in ("auto", "nccl"))
    assert shard_key(auto) != shard_key(nccl)
    auto1, nccl1 = (load_config(TINY_PATH, [f"parallel.allreduce={v}", "parallel.tp=1"]) for v in ("auto", "nccl"))
    assert shard_key(auto1) == shard_key(nccl1)  # tp = 1 baselines: no all-reduce, one shard
