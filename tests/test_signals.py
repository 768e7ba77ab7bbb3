"""SIGINT and SIGTERM: one `error: interrupted (SIG...)` line, exit 130 / 143, no traceback, and no process the
run started left behind (found by the MARK every process of the run inherits, conftest.marked).

A covering subset, not the full product launchers x signals x phases (each Ray case costs ~10 s here):

    launcher               signal                    phase
    ray (embedded)         SIGINT                    during ray.init (raylet up, no rank placed yet)
    ray (embedded)         SIGTERM                   mid-run
    local, elastic agent   SIGINT to the group       mid-run (a terminal's Ctrl-C: the ranks get it too)
    local, elastic agent   SIGTERM                   while the rank processes start
    local, tp = 1          SIGINT                    mid-run (the ranks' code runs in the CLI process)
    torchrun (the wrapper) SIGTERM to the agent      mid-run (launch/torchrun_multinode.sh; the agent ends the ranks)
    torchrun (the wrapper) SIGTERM to the agent      while the rank processes start
    torchrun (the wrapper) SIGINT to the group       mid-bench (tp_runtime.bench's entry: the ranks say nothing)

Every launcher and both signals appear, both phases under Ray and under the elastic agent. "Mid-run": rank
0's CPU graph-mode warning (printed once the worker is built, just before the first step) has appeared and
a second has passed, in a run of 512 requests that lasts far longer; the test checks that no report came.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import MARK, REPO, TINY, assert_refused, child_env, marked, reap

LONG = ["workload.requests=512", "graph.mode=full"]  # full on a CPU: rank 0 warns as stepping begins
STEPPING = "needs a CUDA device"  # that warning
BENCH_TINY = "configs/bench_tiny.yaml"  # tp 1 (in this process under the local launcher) and tp 2
GONE_WITHIN_S = 15.0  # from the command's exit until every marked process is gone (Ray's workers: seconds)


def _names(mark: str) -> dict[int, str]:
    out = {}
    for pid in marked(mark):
        try:
            out[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            pass
    return out


def _interrupt(cmd: list[str], sig: int, ready: Callable[[str, str, int], bool], group: bool = False,
               timeout_s: float = 120, env: dict[str, str] | None = None) -> tuple[int, str, str, dict[int, str]]:
    """Start cmd (its own session), send sig once ready(mark, stderr so far, pid) holds, and wait for it:
    (exit status, stdout, stderr, {pid: name} of its processes still alive GONE_WITHIN_S after it exited)."""
    env = env or child_env()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # files: no pipe fills up
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while not ready(env[MARK], Path(f"/proc/self/fd/{err.fileno()}").read_text(), p.pid):
                stderr = Path(f"/proc/self/fd/{err.fileno()}").read_text()
                assert p.poll() is None, f"ended before the signal: {stderr[-3000:]}"
                assert time.monotonic() < deadline, "the moment to send the signal never came"
                time.sleep(0.1)
            (os.killpg if group else os.kill)(p.pid, sig)
            rc = p.wait(timeout=60)
            deadline = time.monotonic() + GONE_WITHIN_S
            while marked(env[MARK]) and time.monotonic() < deadline:
                time.sleep(0.25)
            left = _names(env[MARK])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
            reap(env[MARK], 0)
        out.seek(0)
        err.seek(0)
        return rc, out.read(), err.read(), left


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tp_runtime.cli", *args]


def _after_line(line: str, delay_s: float = 1.0) -> Callable[[str, str, int], bool]:
    """Ready delay_s after `line` first appeared on stderr."""
    seen: list[float] = []

    def ready(mark: str, stderr: str, pid: int) -> bool:
        if line in stderr and not seen:
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > delay_s

    return ready


def _assert_reported(rc: int, out: str, err: str, left: dict[int, str], sig: int) -> None:
    name = signal.Signals(sig).name
    assert rc == 128 + sig, (rc, err[-3000:])
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: interrupted ({name})"], err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert not left, f"left behind after {name}: {left}"


def test_ray_sigint_during_ray_init_leaves_no_ray_process() -> None:
    def raylet_up(mark: str, stderr: str, pid: int) -> bool:
        return "raylet" in _names(mark).values() and "tp_runtime ray:" not in stderr

    rc, out, err, left = _interrupt(_cli("run", TINY), signal.SIGINT, raylet_up)
    _assert_reported(rc, out, err, left, signal.SIGINT)
    assert "tp_runtime ray:" not in err  # interrupted before any rank was placed


def test_ray_sigterm_mid_run() -> None:
    rc, out, err, left = _interrupt(_cli("run", TINY, *LONG), signal.SIGTERM, _after_line(STEPPING))
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert "tp_runtime ray:" in err and "output_checksum" not in out  # ranks were running, none finished


def test_local_ctrl_c_mid_run_reaches_every_rank_quietly() -> None:
    rc, out, err, left = _interrupt(_cli("run", TINY, "parallel.launcher=local", *LONG), signal.SIGINT,
                                    _after_line(STEPPING), group=True)
    _assert_reported(rc, out, err, left, signal.SIGINT)
    assert "output_checksum" not in out


def test_local_sigterm_while_ranks_start() -> None:
    def ranks_started(mark: str, stderr: str, pid: int) -> bool:
        return len(marked(mark) - {pid}) >= 2  # the agent's two rank processes exist

    rc, out, err, left = _interrupt(_cli("run", TINY, "parallel.launcher=local", *LONG), signal.SIGTERM,
                                    ranks_started)
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert STEPPING not in err  # before any rank built its worker


def test_local_tp1_sigint_mid_run_in_process() -> None:
    rc, out, err, left = _interrupt(_cli("run", TINY, "parallel.launcher=local", "parallel.tp=1", *LONG),
                                    signal.SIGINT, _after_line(STEPPING))
    _assert_reported(rc, out, err, left, signal.SIGINT)
    assert "output_checksum" not in out


def test_torchrun_wrapper_sigterm_to_the_agent_mid_run() -> None:
    # launch/torchrun_multinode.sh runs parallel/torchrun_main.py: the agent ends its ranks, then says so once.
    cmd = [str(REPO / "launch" / "torchrun_multinode.sh"), "--nproc-per-node", "2", "--", TINY, *LONG]
    rc, out, err, left = _interrupt(cmd, signal.SIGTERM, _after_line(STEPPING),
                                    env=child_env(PYTHON=sys.executable))
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert "output_checksum" not in out


def test_torchrun_wrapper_sigterm_while_ranks_start() -> None:
    # The agent is starting its ranks (the first exists): the signal waits until they have started
    # (parallel/agent_signals.py), then the agent ends them all and the wrapper says so once.
    def ranks_started(mark: str, stderr: str, pid: int) -> bool:
        return len(marked(mark) - {pid}) >= 2

    cmd = [sys.executable, "-m", "tp_runtime.parallel.torchrun_main", "--standalone", "--nproc-per-node", "2",
           "-m", "tp_runtime.engine.entry", TINY, *LONG]
    rc, out, err, left = _interrupt(cmd, signal.SIGTERM, ranks_started)
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert STEPPING not in err  # before any rank built its worker


def test_torchrun_wrapper_ctrl_c_mid_bench_reaches_every_rank_quietly(tmp_path: Path) -> None:
    # The bench's torchrun entry ends its ranks quietly too; rank 0 was mid-point (200 repeats: ~10 s here).
    cmd = [sys.executable, "-m", "tp_runtime.parallel.torchrun_main", "--standalone", "--nproc-per-node", "2",
           "-m", "tp_runtime.bench", BENCH_TINY, f"bench.output={tmp_path}", "grid.bench.batch=[1]",
           "grid.bench.context=[12]", "bench.repeats=200"]
    rc, out, err, left = _interrupt(cmd, signal.SIGINT, _after_line("tp_runtime: all-reduce:"), group=True)
    _assert_reported(rc, out, err, left, signal.SIGINT)
    assert not (tmp_path / "tiny" / "summary.json").exists()  # stopped before the point finished


@pytest.mark.parametrize("args, key", [
    (["run", TINY, "parallel.launcher=torchrun"], "parallel.launcher"),
    (["run", TINY, "workload.requests=0"], "workload.requests"),
    (["check", TINY, "workload.requests=0"], "workload.requests"),
    (["run", TINY, "parallel.launcher=local", "parallel.tp=1", "parallel.fail_rank=0"], "parallel.fail_rank"),
    (["run", TINY, "parallel.launcher=local", "parallel.tp=1", "parallel.fail_rank=0", "parallel.fail_mode=stop"],
     "parallel.fail_rank"),
    (["check", TINY, "parallel.launcher=local", "parallel.fail_rank=1"], "parallel.fail_rank"),
    pytest.param(["run", TINY, "runtime.device=cuda"], "runtime.device",  # embedded Ray: Ray never starts
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="refused only without 2 GPUs")),
])
def test_refused_before_anything_starts(args: list[str], key: str) -> None:
    env = child_env()
    r = subprocess.run(_cli(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert_refused(r, key)
    assert not reap(env[MARK], 0)  # nothing was started (no Ray, no rank)


@pytest.mark.parametrize("args, key", [
    (["parallel.launcher=torchrun"], "parallel.launcher"),
    (["parallel.launcher=local", "parallel.fail_rank=0"], "parallel.fail_rank"),  # its tp = 1 lanes
    pytest.param(["parallel.launcher=ray", "runtime.device=cuda", "grid.parallel.tp=[1]"], "runtime.device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without GPUs")),
    pytest.param(["parallel.launcher=local", "runtime.device=cuda"], "runtime.device",  # its tp = 2 launch
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="refused only without 2 GPUs")),
])
def test_bench_refused_before_any_rank_starts(args: list[str], key: str, tmp_path: Path) -> None:
    # The GPU cases are refused by the same check as `run` (launcher.check_launchable), before Ray or a rank starts.
    out = tmp_path / "out"
    env = child_env()
    r = subprocess.run(_cli("bench", BENCH_TINY, f"bench.output={out}", *args), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert_refused(r, key)
    assert not out.exists()  # refused before the output directory was made
    assert not reap(env[MARK], 0)  # nothing was started (no Ray, no rank)


def test_usage_shows_overrides_as_optional() -> None:
    r = subprocess.run(_cli("run"), cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "config [overrides ...]" in r.stderr, r.stderr
    assert "required: config" in r.stderr and "overrides" not in r.stderr.splitlines()[-1], r.stderr
