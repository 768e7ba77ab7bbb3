"""The fault matrix: SIGINT, SIGTERM and SIGHUP, to the command's pid or to its whole process group (a terminal's
Ctrl-C or hang-up), at a moment found by polling its output, under each launcher: one `error: interrupted (SIG...)`
line, exit 128 + n, no traceback from any process, and no process the run started alive GONE_WITHIN_S after it
exited (found by the MARK every process of the run inherits, conftest.marked). SIGKILL of torch's agent (or of the
torchrun wrapper, which is the agent) leaves no rank behind either.

    launcher                  cases (signal, to the pid or the group, moment)
    local, elastic agent      INT group mid-run, TERM pid ranks starting, HUP group mid-run, INT pid importing
    local, tp = 1             INT pid mid-run (the ranks' code runs in the CLI process)
    ray (embedded)            INT pid / group and TERM pid inside ray.init, TERM pid / group and HUP group mid-run
    torchrun wrapper          TERM agent mid-run (launch/torchrun_multinode.sh), TERM pid ranks starting, INT group
                              mid-bench, HUP group mid-run, KILL pid mid-run
    torchrun (torch's own)    KILL agent mid-run (the ranks notice their parent's death)

Moments: "importing" is the command's first second (torch's import); "ray.init" has the raylet up and no rank
placed; "ranks starting" has the agent's first rank processes; "mid-run" is a second after rank 0's CPU
graph-mode warning (printed once the worker is built, just before the first step) in a run of 512 requests that
lasts far longer; the test checks that no report came. The Ray cases share one xdist group: each starts a Ray.
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
GONE_WITHIN_S = 5.0  # from the command's exit until every marked process is gone


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


def _torchrun(*args: str, wrapper: bool = True) -> list[str]:
    run = "tp_runtime.parallel.torchrun_main" if wrapper else "torch.distributed.run"
    return [sys.executable, "-m", run, "--standalone", "--nproc-per-node", "2", *args]


def _after_line(line: str, delay_s: float = 1.0) -> Callable[[str, str, int], bool]:
    """Ready delay_s after `line` first appeared on stderr."""
    seen: list[float] = []

    def ready(mark: str, stderr: str, pid: int) -> bool:
        if line in stderr and not seen:
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > delay_s

    return ready


def _after_start(delay_s: float) -> Callable[[str, str, int], bool]:
    """Ready delay_s after the first poll (the command is importing torch)."""
    t0: list[float] = []

    def ready(mark: str, stderr: str, pid: int) -> bool:
        t0.append(time.monotonic())
        return t0[-1] - t0[0] > delay_s

    return ready


def _ranks_started(mark: str, stderr: str, pid: int) -> bool:
    return len(marked(mark) - {pid}) >= 2  # the agent's first rank processes exist


def _raylet_up(mark: str, stderr: str, pid: int) -> bool:
    return "raylet" in _names(mark).values() and "tp_runtime ray:" not in stderr


def _assert_reported(rc: int, out: str, err: str, left: dict[int, str], sig: int) -> None:
    name = signal.Signals(sig).name
    assert rc == 128 + sig, (rc, err[-3000:])
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: interrupted ({name})"], err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert not left, f"left behind after {name}: {left}"


LOCAL = ["parallel.launcher=local"]
MATRIX = [  # (command, signal, to the group, moment, what must not have happened yet)
    pytest.param(_cli("run", TINY, *LOCAL, *LONG), signal.SIGINT, True, _after_line(STEPPING), "output_checksum",
                 id="local-INT-group-mid-run"),
    pytest.param(_cli("run", TINY, *LOCAL, *LONG), signal.SIGTERM, False, _ranks_started, STEPPING,
                 id="local-TERM-pid-ranks-starting"),
    pytest.param(_cli("run", TINY, *LOCAL, *LONG), signal.SIGHUP, True, _after_line(STEPPING), "output_checksum",
                 id="local-HUP-group-mid-run"),
    pytest.param(_cli("run", TINY, *LOCAL, *LONG), signal.SIGINT, False, _after_start(1.0), STEPPING,
                 id="local-INT-pid-importing"),
    pytest.param(_cli("run", TINY, *LOCAL, "parallel.tp=1", *LONG), signal.SIGINT, False, _after_line(STEPPING),
                 "output_checksum", id="local-tp1-INT-pid-mid-run"),
    pytest.param(_torchrun("-m", "tp_runtime.engine.entry", TINY, *LONG), signal.SIGTERM, False, _ranks_started,
                 STEPPING, id="torchrun-TERM-pid-ranks-starting"),
    pytest.param(_torchrun("-m", "tp_runtime.engine.entry", TINY, *LONG), signal.SIGHUP, True,
                 _after_line(STEPPING), "output_checksum", id="torchrun-HUP-group-mid-run"),
]
RAY = [pytest.param(*p.values, id=p.id, marks=pytest.mark.xdist_group("ray")) for p in [
    pytest.param(_cli("run", TINY), signal.SIGINT, False, _raylet_up, "tp_runtime ray:", id="ray-INT-pid-ray-init"),
    pytest.param(_cli("run", TINY), signal.SIGINT, True, _raylet_up, "tp_runtime ray:", id="ray-INT-group-ray-init"),
    pytest.param(_cli("run", TINY), signal.SIGTERM, False, _raylet_up, "tp_runtime ray:",
                 id="ray-TERM-pid-ray-init"),
    pytest.param(_cli("run", TINY, *LONG), signal.SIGTERM, False, _after_line(STEPPING), "output_checksum",
                 id="ray-TERM-pid-mid-run"),
    pytest.param(_cli("run", TINY, *LONG), signal.SIGTERM, True, _after_line(STEPPING), "output_checksum",
                 id="ray-TERM-group-mid-run"),
    pytest.param(_cli("run", TINY, *LONG), signal.SIGHUP, True, _after_line(STEPPING), "output_checksum",
                 id="ray-HUP-group-mid-run"),
]]


@pytest.mark.parametrize("cmd, sig, group, ready, not_yet", MATRIX + RAY)
def test_a_signal_ends_the_run_in_one_line(cmd: list[str], sig: int, group: bool,
                                           ready: Callable[[str, str, int], bool], not_yet: str) -> None:
    rc, out, err, left = _interrupt(cmd, sig, ready, group=group)
    _assert_reported(rc, out, err, left, sig)
    assert not_yet not in out + err  # the moment was before it


def test_torchrun_wrapper_sigterm_to_the_agent_mid_run() -> None:
    # launch/torchrun_multinode.sh runs parallel/torchrun_main.py: the agent ends its ranks, then says so once.
    cmd = [str(REPO / "launch" / "torchrun_multinode.sh"), "--nproc-per-node", "2", "--", TINY, *LONG]
    rc, out, err, left = _interrupt(cmd, signal.SIGTERM, _after_line(STEPPING),
                                    env=child_env(PYTHON=sys.executable))
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert "output_checksum" not in out


def test_torchrun_wrapper_ctrl_c_mid_bench_reaches_every_rank_quietly(tmp_path: Path) -> None:
    # The bench's torchrun entry ends its ranks quietly too; rank 0 was mid-point (200 repeats: ~10 s here).
    cmd = _torchrun("-m", "tp_runtime.bench", BENCH_TINY, f"bench.output={tmp_path}", "grid.bench.batch=[1]",
                    "grid.bench.context=[12]", "bench.repeats=200")
    rc, out, err, left = _interrupt(cmd, signal.SIGINT, _after_line("tp_runtime: all-reduce:"), group=True)
    _assert_reported(rc, out, err, left, signal.SIGINT)
    assert not (tmp_path / "tiny" / "summary.json").exists()  # stopped before the point finished


@pytest.mark.parametrize("wrapper", [True, False], ids=["wrapper", "torchrun"])
def test_ranks_end_when_their_agent_is_killed(wrapper: bool) -> None:
    # SIGKILL leaves the agent no chance to end its ranks: they notice their parent's death themselves.
    cmd = _torchrun("-m", "tp_runtime.engine.entry", TINY, *LONG, wrapper=wrapper)
    rc, out, err, left = _interrupt(cmd, signal.SIGKILL, _after_line(STEPPING))
    assert rc == -signal.SIGKILL
    assert not left, f"ranks left behind: {left}"


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


def test_a_large_model_on_a_cpu_says_what_it_builds_before_the_long_silence() -> None:
    # configs/v4_flash.yaml on a CPU builds for minutes: one progress line on stderr comes first (stdout keeps
    # only the report), and a signal during the build still ends the run in one line. Eight of its layers (3.4 GiB
    # of weights, over the line's 1 GiB) keep the test within a small host's memory: all 43 need 20 GiB, and the
    # memory check refuses them on a host with less available.
    rc, out, err, left = _interrupt(_cli("run", "configs/v4_flash.yaml", *LOCAL, "parallel.tp=1", "model.layers=0-7"),
                                    signal.SIGTERM, _after_line("tp_runtime: building 8 layers", 0.5), timeout_s=60)
    _assert_reported(rc, out, err, left, signal.SIGTERM)
    assert "on the CPU: slow" in err and out == ""


@pytest.fixture
def own_handlers():
    """This process's handlers of the signals, put back after the test (interruptible leaves them default)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_an_interrupt_that_python_wrapped_is_reported_as_one(capsys, own_handlers) -> None:
    # Python 3.11 turns an interrupt raised inside __set_name__ (a signal landing in a class body of a lazy
    # import) into RuntimeError(...) from it: still the one line and 128 + n, not a traceback and status 1.
    from tp_runtime.parallel import interrupt

    def command() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises Interrupted here
            time.sleep(5)
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'cached_property' instance") from e
        return 0

    assert interrupt.interruptible(command) == 128 + signal.SIGINT
    assert capsys.readouterr().err.splitlines() == ["error: interrupted (SIGINT)"]

    def failing() -> int:  # any other failure still propagates
        raise RuntimeError("a real failure")

    with pytest.raises(RuntimeError, match="a real failure"):
        interrupt.interruptible(failing)
