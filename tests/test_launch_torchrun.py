"""torchrun and the local elastic launcher on real processes: standalone and two node-processes
(c10d rendezvous on a free loopback port, through launch/torchrun_multinode.sh) reproduce the local
launcher's checksum exactly (same code, same CPU, one thread per rank, a two-addend all-reduce: see
test_launch_ray.py), one rank's death ends every rank non-zero in bounded time, a stopped (hung)
rank is named and the run ends within parallel.timeout_s plus seconds, and the ranks listen on
127.0.0.1 only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (MARK, REPO, STOP, STOP_TIMEOUT_S, TINY, child_env, free_port, is_loopback, last_json, reap,
                      run_cli, stop, stopped_at, watch_listeners)

MULTINODE = str(REPO / "launch" / "torchrun_multinode.sh")


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of each process; all killed and the test failed past timeout_s."""
    deadline = time.monotonic() + timeout_s
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
    except subprocess.TimeoutExpired:
        stop(procs, grace_s=5)
        raise AssertionError(f"torchrun did not finish within {timeout_s} s") from None
    return out


def _two_nodes(env: dict[str, str], overrides: list[str]) -> list[subprocess.Popen]:
    endpoint = f"127.0.0.1:{free_port()}"
    return [subprocess.Popen([MULTINODE, "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", endpoint,
                              "--nproc-per-node", "1", "--", TINY, *overrides],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k in (0, 1)]


@pytest.fixture(scope="module")
def standalone() -> tuple[subprocess.CompletedProcess, set[tuple[int, str, str, int]]]:
    """`torchrun --standalone --nproc-per-node 2 -m tp_runtime.engine.entry configs/tiny.yaml`, watched for listening
    sockets (watch_listeners: it also asserts that no process outlived it); shared by the checksum and the listener
    test (one xdist group, tests/conftest.py)."""
    return watch_listeners([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "tp_runtime.engine.entry", TINY], timeout_s=300)


def test_torchrun_standalone_matches_local(standalone, local_checksum: float) -> None:
    r, _ = standalone
    assert r.returncode == 0, r.stderr[-4000:]
    rec = last_json(r.stdout)
    assert rec["launcher"] == "torchrun" and rec["tp"] == 2 and rec["completed"] == 8
    assert rec["output_checksum"] == local_checksum


def test_torchrun_two_node_processes_match_local(local_checksum: float) -> None:
    env = child_env(PYTHON=sys.executable)
    results = _wait_all(_two_nodes(env, []), timeout_s=300)
    assert [rc for rc, _, _ in results] == [0, 0], [e[-3000:] for _, _, e in results]
    reports = [out for _, out, _ in results if out.strip()]
    assert len(reports) == 1, "exactly one node holds rank 0 and prints the report"
    assert last_json(reports[0])["output_checksum"] == local_checksum
    assert not reap(env[MARK])


def test_torchrun_rank_failure_ends_every_node() -> None:
    # The rank that becomes 1 SIGKILLs itself as step 5 begins (parallel.fail_rank, a testing key).
    env = child_env(PYTHON=sys.executable)
    t0 = time.monotonic()
    results = _wait_all(_two_nodes(env, ["parallel.fail_rank=1", "parallel.fail_step=5"]), timeout_s=120)
    elapsed = time.monotonic() - t0
    assert all(rc != 0 for rc, _, _ in results), [rc for rc, _, _ in results]
    assert any("SIGKILL" in err for _, _, err in results), results[0][2][-3000:]
    # A healthy run takes ~10 s here; the peer's next collective fails at once on the closed
    # connection, so the bound is the run plus the agents' shutdown, well inside a minute.
    assert elapsed < 60, elapsed
    assert not reap(env[MARK])


def _workers(agent: int) -> list[int]:
    """The rank processes torchrun's agent started (its children)."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == agent:
                kids.append(int(d))
    return kids


def _cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_sigkill_one_torchrun_rank_ends_all() -> None:
    env = child_env()
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "tp_runtime.engine.entry", TINY, "workload.requests=128"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Mid-run: both ranks exist and each has spent 3 s of CPU. Measured here: stepping begins
        # at ~1.7 s of CPU per rank (torch imported, group joined, weights drawn), and 64 requests
        # end at ~5.5 s, so 128 requests leave the run far from done when the kill lands.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = _workers(p.pid)
            try:
                if len(ranks) == 2 and min(_cpu_s(r) for r in ranks) >= 3.0:
                    break
            except OSError:  # a rank ended between listing and reading: the poll below reports it
                pass
            assert p.poll() is None, p.communicate()[1][-3000:]
            time.sleep(0.2)
        else:
            raise AssertionError("torchrun's two ranks did not get going within 120 s")
        os.kill(max(ranks), signal.SIGKILL)
        t0 = time.monotonic()
        [(rc, out, err)] = _wait_all([p], timeout_s=60)
        elapsed = time.monotonic() - t0
    finally:
        stop([p], grace_s=5)
    assert rc != 0 and "SIGKILL" in err, err[-3000:]
    assert "output_checksum" not in out  # killed mid-run: no report
    assert elapsed < 30, elapsed  # the agent notices within its 0.1 s monitor interval, then stops the other rank
    assert not reap(env[MARK])


def test_local_launcher_rank_failure_is_launch_error() -> None:
    t0 = time.monotonic()
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.fail_rank=1", "parallel.fail_step=5"],
                timeout_s=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: rank 1 failed (exit code -9)"), r.stderr[-3000:]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:] and "Traceback" not in r.stderr
    assert elapsed < 60, elapsed


def test_local_launcher_failed_bench_ends_on_its_error_line(tmp_path) -> None:
    # The killed rank leaves semaphores (tqdm's lock) to multiprocessing's resource tracker, whose warning
    # used to follow the error line.
    r = run_cli(["bench", "configs/bench_tiny.yaml", "grid.parallel.tp=[2]", "grid.bench.batch=[1]",
                 "grid.bench.context=[12]", f"bench.output={tmp_path}", "parallel.fail_rank=1",
                 "parallel.fail_step=2"], timeout_s=120)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: rank 1 failed"), r.stderr[-3000:]
    assert "leaked" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_local_full_graphs_on_cpu_warn_once_and_say_so() -> None:
    r = run_cli(["run", TINY, "parallel.launcher=local", "graph.mode=full", "workload.requests=2"], timeout_s=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("graph.mode=full needs a CUDA device") == 1, r.stderr[-3000:]  # rank 0 only
    rec = last_json(r.stdout)
    assert rec["steps_by_path"].get("full", 0) > 0, rec["steps_by_path"]
    summary = r.stdout.splitlines()[0]
    assert "graphs=full (hoisted; not captured on cpu: run eagerly)" in summary, summary


def test_torchrun_world_size_must_match_tp() -> None:
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                        "-m", "tp_runtime.engine.entry", TINY], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "torchrun started 1 processes (nnodes x nproc-per-node) but parallel.tp=2" in r.stderr, r.stderr[-3000:]
    assert not reap(env[MARK])


# ---------------------------------------------------------------- a hung rank (SIGSTOP)

def test_local_launcher_names_a_stopped_rank_within_the_timeout() -> None:
    r = run_cli(["run", TINY, "parallel.launcher=local", "parallel.fail_rank=1", *STOP], timeout_s=120)
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: rank 1 failed") and "rank 1 (host " in err and "stopped answering" in err, err
    after = r.ended - stopped_at(r.stderr, 1)
    assert STOP_TIMEOUT_S - 1 < after < STOP_TIMEOUT_S + 10, after  # run_cli also asserts no process is left


def test_torchrun_names_a_stopped_rank_within_the_timeout() -> None:
    env = child_env()
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "tp_runtime.engine.entry", TINY, "parallel.fail_rank=0", *STOP], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    [(rc, out, err)] = _wait_all([p], timeout_s=120)
    after = time.time() - stopped_at(err, 0)
    assert rc != 0 and "output_checksum" not in out
    assert re.search(r"rank 1: rank 0 \(host \S+, pid \d+\) stopped answering", err), err[-3000:]
    assert STOP_TIMEOUT_S - 1 < after < STOP_TIMEOUT_S + 10, after
    assert not reap(env[MARK])  # the stopped rank was ended, not left behind


# ---------------------------------------------------------------- what listens during a run


def test_local_launcher_listens_on_loopback_only(local_run: dict) -> None:
    # The launcher's store (the CLI process) and gloo's sockets in the ranks, sampled every 0.25 s while the
    # session's local run (conftest.local_run) ran: each is bound at the rendezvous and held to the end of the run.
    seen = {tuple(x) for x in local_run["listeners"]}
    assert local_run["returncode"] == 0, local_run["stderr"][-3000:]
    assert len({pid for pid, _, _, _ in seen}) >= 3, seen  # the CLI's store, gloo's socket in each rank
    assert all(is_loopback(addr) for _, _, addr, _ in seen), sorted(seen)


def test_torchrun_ranks_listen_on_loopback_only_and_the_agent_is_the_known_exception(standalone) -> None:
    # torch's agent (pt_elastic) binds its rendezvous stores on every interface and torchrun offers no
    # way to hand it a loopback socket (README, security notes); the ranks themselves stay on 127.0.0.1.
    r, seen = standalone
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = {x for x in seen if x[1] != "pt_elastic"}
    assert len(ranks) >= 2 and all(is_loopback(addr) for _, _, addr, _ in ranks), sorted(seen)
    assert {name for _, name, addr, _ in seen if not is_loopback(addr)} <= {"pt_elastic"}, sorted(seen)


def test_torchrun_wrapper_refuses_bad_arguments_before_any_rank(tmp_path) -> None:
    # One error line and exit 2, before torchrun starts anything: no process count, and a config file of one of
    # the project's entries that is missing or a folder (each rank used to fail on its own; 0 ended in a traceback).
    from conftest import assert_refused

    wrapper = [sys.executable, "-m", "tp_runtime.parallel.torchrun_main", "--standalone"]
    cases = [(["--nproc-per-node", "0", "-m", "tp_runtime.engine.entry", TINY], "--nproc-per-node 0"),
             (["--nproc-per-node=1", "-m", "tp_runtime.engine.entry", str(tmp_path / "no.yaml")], "does not exist"),
             (["--nproc-per-node=1", "-m", "tp_runtime.bench", str(tmp_path)], "is a directory")]
    for args, needle in cases:
        r = subprocess.run(wrapper + args, capture_output=True, text=True, timeout=60, cwd=REPO, env=child_env())
        assert_refused(r, needle)


def test_torchrun_wrapper_rendezvous_that_never_completes_ends_in_one_line_naming_its_address() -> None:
    # Node 0 of two, the other never comes: torch's RendezvousTimeoutError after join_timeout, as one line.
    endpoint = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tp_runtime.parallel.torchrun_main", "--nnodes", "2", "--node-rank", "0",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-conf", "join_timeout=3",
                        "--nproc-per-node", "1", "-m", "tp_runtime.engine.entry", TINY, "parallel.tp=2"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=child_env())
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: the rendezvous at {endpoint} did not complete")
    assert time.monotonic() - t0 < 60
