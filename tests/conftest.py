"""Shared test helpers: run the CLI as a user would (in a subprocess, bounded in time, leaving no
process behind), read its JSON line; a child-process environment, free ports, and the local
launcher's checksum of configs/tiny.yaml."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = ROOT = Path(__file__).resolve().parents[1]
TINY = "configs/tiny.yaml"  # relative to REPO, the working directory of every CLI run
TINY_PATH = str(REPO / TINY)  # for configs loaded inside the test process


MARK = "TP_LAUNCH_TEST_MARK"  # every process a test starts carries it, however deep or re-parented


def child_env(**extra: str) -> dict[str, str]:
    """This checkout on PYTHONPATH, one intra-op thread per rank (the local launcher's choice on two
    cores, and what every launcher gets here, so checksums can be compared exactly), no Ray cluster,
    and a fresh MARK value that finds every process started under this environment."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env[MARK] = uuid.uuid4().hex
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _not_json(word: str):
    raise ValueError(f"{word} is not JSON (the record must encode a non-finite value as null)")


def last_json(text: str) -> dict:
    """The last line of `text` that is a JSON object (the run's record), parsed strictly: NaN,
    Infinity and -Infinity, which Python's json module accepts by default, are refused."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line, parse_constant=_not_json)
    raise AssertionError(f"no JSON line in output:\n{text[-3000:]}")


def marked(mark: str) -> set[int]:
    """Live (not zombie) processes whose environment holds MARK=mark."""
    needle = f"{MARK}={mark}".encode()
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                stat = Path(f"/proc/{d}/stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":
                    out.add(int(d))
        except OSError:
            continue
    return out


def reap(mark: str, wait_s: float = 20.0) -> set[int]:
    """Wait up to wait_s for every process carrying `mark` to end; SIGKILL the rest (they are this
    test's own) and return their pids, so a test can assert that none was left behind."""
    deadline = time.monotonic() + wait_s
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def stop(procs: list[subprocess.Popen], grace_s: float = 30.0) -> None:
    """SIGTERM these processes (in order) and wait for them; SIGKILL after grace_s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def run_cli(args: list[str], timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m tp_runtime.cli ARGS` in this checkout, bounded by timeout_s; asserts that no process
    it started outlives it."""
    env = {**(env or child_env()), MARK: uuid.uuid4().hex}  # this command's own processes
    proc = subprocess.Popen([sys.executable, "-m", "tp_runtime.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop([proc], grace_s=5)
        out, err = proc.communicate()
        reap(env[MARK], 0)
        raise AssertionError(f"timed out after {timeout_s} s\n{out[-2000:]}\n{err[-4000:]}") from None
    left = reap(env[MARK])
    assert not left, f"processes left behind by {args}: {left}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def local_checksum() -> float:
    """output_checksum of configs/tiny.yaml (tp = 2) under the local launcher: the reference every
    other launcher must reproduce."""
    r = run_cli(["run", TINY, "parallel.launcher=local"], timeout_s=300)
    assert r.returncode == 0, r.stderr[-4000:]
    rec = last_json(r.stdout)
    assert rec["launcher"] == "local" and rec["tp"] == 2 and rec["completed"] == 8
    return rec["output_checksum"]
