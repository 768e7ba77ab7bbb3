"""Shared test helpers: run the CLI as a user would (in a subprocess, bounded in time, leaving no
process behind), read its JSON line; a child-process environment, free ports, and the local
launcher's checksum of configs/tiny.yaml. Also how the suite runs on pytest-xdist workers (`pytest -q`
runs `-n 2 --dist loadgroup`, pyproject.toml): the tests that share a costly fixture form one group
(XDIST_GROUPS), and a session value is computed once for all workers (once_per_run)."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

REPO = ROOT = Path(__file__).resolve().parents[1]

# The Triton kernel tests run on a CUDA GPU, or on the CPU through Triton's interpreter when
# TRITON_INTERPRET=1 (slowly; it checks indexing and masking, not the compiled code).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
KERNEL_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET),
                                                    reason="needs a CUDA GPU (or TRITON_INTERPRET=1)")]
TINY = "configs/tiny.yaml"  # relative to REPO, the working directory of every CLI run
TINY_PATH = str(REPO / TINY)  # for configs loaded inside the test process
# Tiny-like dims whose FP8 matrices shard on whole 128-blocks at tp 1, 2 and 4 (q_lora_rank, wq_b rows
# 8 x 128, wo_a rows 4 x 128, wo_b columns 512)
FP8_DIMS = ["model.hidden_size=256", "model.head_dim=128", "model.qk_rope_head_dim=64", "model.q_lora_rank=128",
            "model.o_lora_rank=128", "model.index_head_dim=64"]


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


def _listening_inodes() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    out = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, words)
            out[int(f[9])] = (addr, int(hexport, 16))
    return out


def listeners(pids: set[int]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of every listening TCP socket these processes hold."""
    listening, found = _listening_inodes(), []
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in listening:
                found.append((pid, name, *listening[int(target[8:-1])]))
    return found


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1" or addr.startswith("::ffff:127.")


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
    ended = time.time()
    left = reap(env[MARK])
    assert not left, f"processes left behind by {args}: {left}"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.ended = ended  # wall-clock time (time.time()) at which the command exited
    return done


def assert_refused(r: subprocess.CompletedProcess, *needles: object) -> str:
    """A command refused before anything started: exit 2, nothing on stdout, no traceback, and stderr exactly
    one `error:` line holding every needle (str() of each: keys, paths). Returns that line."""
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    for needle in map(str, needles):
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def watch_listeners(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None,
                    period_s: float = 0.25) -> tuple[subprocess.CompletedProcess, set[tuple[int, str, str, int]]]:
    """Run cmd in this checkout, its stdout and stderr pipes (as run_cli's), and collect every listening TCP socket
    that any process it starts holds while it runs, sampled every period_s: {(pid, name, address, port)}."""
    env = {**(env or child_env()), MARK: uuid.uuid4().hex}
    seen: set[tuple[int, str, str, int]] = set()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    texts: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: texts.__setitem__(k, f.read()), daemon=True)
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]  # drained while it runs: no pipe fills up
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= set(listeners(marked(env[MARK])))
            time.sleep(period_s)
    finally:
        if proc.poll() is None:
            stop([proc], grace_s=5)
        left = reap(env[MARK])
        for t in readers:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
    done = subprocess.CompletedProcess(cmd, proc.returncode, texts.get("out", ""), texts.get("err", ""))
    assert not left, f"processes left behind by {cmd}: {left}"
    assert done.returncode is not None and time.monotonic() < deadline, f"{cmd} ran past {timeout_s} s"
    return done, seen


# A hung rank (parallel.fail_mode=stop): tests/test_launch_torchrun.py, test_launch_ray.py.
STOPPED = re.compile(r"rank (\d+) stops itself at step \d+ \(time ([0-9.]+)\)")
# parallel.timeout_s of the stopped-rank tests: the peer's collective waits this long, then the
# heartbeat names the rank that stopped and the peer ends it. The bound asserted is this plus 10 s:
# measured here 11 s after the stop under torchrun and 13-14 s under the local launcher (its elastic
# agent takes ~3 s to tear down after a failure), with the 2-core machine otherwise idle.
STOP_TIMEOUT_S = 10
STOP = ["parallel.fail_mode=stop", "parallel.fail_step=5", f"parallel.timeout_s={STOP_TIMEOUT_S}"]


def stopped_at(stderr: str, rank: int) -> float:
    """When the rank stopped itself (its own stderr line, wall clock)."""
    found = {int(r): float(t) for r, t in STOPPED.findall(stderr)}
    assert rank in found, stderr[-3000:]
    return found[rank]


# ---------------------------------------------------------------- parallel workers (pytest-xdist)

# Each worker's share of the cores for torch's intra-op threads in the test process (as the local launcher gives
# each rank: launcher.py). With torch's default (every core) in each of two workers on two cores, the threads of a
# tiny in-process model spin-wait for each other and for the other worker: measured here, the in-process tests of
# test_fp8_cache.py and test_parity.py next to a busy core took 30 s and 36 CPU-seconds with 2 threads, 14 s and
# 14 CPU-seconds with 1. The processes the tests start are not affected (child_env sets their threads).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Tests that use a module- or class-scoped fixture that is costly to build run one after another on one
# worker (--dist loadgroup), so that fixture is built once, as in a serial run: (test file, fixture) -> group.
XDIST_GROUPS = {
    ("test_checkpoint.py", "ckpt"): "checkpoint",  # a 3-file checkpoint written by the CLI (and tp1, its run)
    ("test_fp8_cache.py", "fp8_run"): "fp8_cache",  # the FP8-cache scenario run in process
    ("test_launch_torchrun.py", "standalone"): "torchrun",  # a torchrun --standalone run, watched for listeners
    ("test_parity.py", "tp1"): "parity",  # the parity scenario run in process
    ("test_serve_bench.py", "tp1_run"): "serve_bench",  # a serve-bench run through the CLI
}
# Tests that start Ray (an embedded instance, a two-node cluster, Ray under signals: test_signals.py marks its
# own) run one after another on one worker: Ray instances starting side by side on two cores have missed the
# raylet's start-up limit.
RAY_FILES = ("test_launch_ray.py",)
RAY_TESTS = ("test_tiny_sweep_under_ray", "test_tiny_run_under_embedded_ray")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in RAY_FILES or item.originalname in RAY_TESTS:
            item.add_marker(pytest.mark.xdist_group("ray"))
        for (file, fixture), group in XDIST_GROUPS.items():
            if item.path.name == file and fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make) -> object:
    """make() (a JSON value) computed once for the whole run: on xdist workers the first one computes it
    and leaves it in the run's shared temporary directory, the others wait for it and read it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make()
    shared = tmp_path_factory.getbasetemp().parent  # this run's directory, above each worker's own
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / f"{name}.json"
        if done.is_file():
            return json.loads(done.read_text())
        value = make()
        done.write_text(json.dumps(value))
        return value


@pytest.fixture(scope="session")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`run configs/tiny.yaml parallel.launcher=local` (tp = 2), once for the whole run: its returncode, stdout and
    stderr, and `listeners`, every listening socket its processes held while it ran ([pid, name, address, port],
    watch_listeners): the launcher's store in the CLI process and gloo's in each rank, held from the rendezvous to
    the end of the run, so its 8 requests are sampled in every state a longer run has."""
    def run() -> dict:
        r, seen = watch_listeners([sys.executable, "-m", "tp_runtime.cli", "run", TINY, "parallel.launcher=local"],
                                  timeout_s=300)
        return {"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "listeners": sorted(seen)}

    return once_per_run(tmp_path_factory, "local_run", run)


@pytest.fixture(scope="session")
def local_checksum(local_run: dict) -> float:
    """output_checksum of configs/tiny.yaml (tp = 2) under the local launcher: the reference every
    other launcher must reproduce."""
    assert local_run["returncode"] == 0, local_run["stderr"][-4000:]
    rec = last_json(local_run["stdout"])
    assert rec["launcher"] == "local" and rec["tp"] == 2 and rec["completed"] == 8
    return rec["output_checksum"]


def with_settings(cfg, section: str, **values):
    """A deep copy of the RunConfig cfg with cfg.<section>.<key> = value for each keyword; cfg is left as is."""
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        setattr(getattr(out, section), key, value)
    return out
