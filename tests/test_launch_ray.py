"""Ray launcher on real Ray: the embedded instance (the README quickstart), a two-node cluster on this
machine, `ray job submit` to it, and failures (a rank that dies, a placement group that cannot fit).

Checksums are compared exactly with the local launcher's: every launcher runs the same code on the
same CPU with one intra-op thread per rank, and a 2-rank gloo all-reduce adds two addends (a + b ==
b + a in IEEE arithmetic), so nothing reorders a floating-point sum; any difference is a bug.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import (MARK, REPO, STOP, STOP_TIMEOUT_S, TINY, child_env, free_port, is_loopback, last_json, listeners,
                      marked, reap, run_cli, stop, stopped_at, watch_listeners)
from tp_runtime.config import load_config
from tp_runtime.engine.entry import worker_entry
from tp_runtime.parallel import ray_launch  # before `import ray`: the embedded instance binds 127.0.0.1
from tp_runtime.parallel.errors import LaunchError, LaunchRefused

import ray  # noqa: E402  (after ray_launch, see above)

PLACEMENT = re.compile(r"rank (\d+) on (\S+) node ([0-9a-f]+)")


def placements(stderr: str) -> dict[int, tuple[str, str]]:
    """rank -> (node IP, node id) from the launcher's placement line."""
    return {int(r): (ip, node) for r, ip, node in PLACEMENT.findall(stderr)}


# ---------------------------------------------------------------- embedded (the quickstart)


@pytest.fixture(scope="module")
def quickstart() -> tuple[subprocess.CompletedProcess, set[tuple[int, str, str, int]]]:
    """`tp-runtime run configs/tiny.yaml` as the README runs it, its output through pipes, watched for listening
    sockets (watch_listeners, which also asserts that no process outlived it); one Ray start for two tests."""
    return watch_listeners([sys.executable, "-m", "tp_runtime.cli", "run", TINY], timeout_s=300)


def test_quickstart_embedded_ray_matches_local(quickstart, local_checksum: float) -> None:
    """`tp-runtime run configs/tiny.yaml` as the README runs it: Ray is the config's launcher, an
    embedded instance on 127.0.0.1 starts and stops inside the command, nothing is left running."""
    r, _ = quickstart
    assert r.returncode == 0, r.stderr[-4000:]
    rec = last_json(r.stdout)
    assert rec["launcher"] == "ray" and rec["completed"] == 8
    assert rec["output_checksum"] == local_checksum
    where = placements(r.stderr)
    assert sorted(where) == [0, 1] and {ip for ip, _ in where.values()} == {"127.0.0.1"}, r.stderr[-2000:]
    # stderr is a pipe here: no colour codes in the ranks' forwarded lines, and no token-auth notice for
    # the private instance
    assert "\x1b[" not in r.stderr and "Token authentication" not in r.stderr, r.stderr[-2000:]


def test_embedded_ray_names_a_stopped_rank_0_within_the_timeout() -> None:
    # Rank 0 also hosts the rendezvous store under Ray: rank 1's heartbeat calls stall with it, and
    # the stall itself names rank 0. Bound as for torchrun (test_launch_torchrun.py): timeout + 10 s;
    # measured ~12.5 s after the stop (the driver's POLL_S and FAILURE_GRACE_S come on top).
    r = run_cli(["run", TINY, "parallel.fail_rank=0", *STOP], timeout_s=180)
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr.strip().splitlines()[-1]
    assert re.search(r"RankLostError: rank 0 \(host \S+, pid \d+\) stopped answering", err), err
    after = r.ended - stopped_at(r.stderr, 0)
    assert STOP_TIMEOUT_S - 1 < after < STOP_TIMEOUT_S + 10, after  # run_cli: no process left behind


def test_embedded_ray_listens_on_loopback_only(quickstart) -> None:
    # Ray's servers (GCS, raylet, workers) and rank 0's rendezvous store, sampled every 0.25 s while the
    # quickstart ran: Ray's from its start, the ranks' from their rendezvous, each held to the end of the run.
    r, seen = quickstart
    assert r.returncode == 0, r.stderr[-3000:]
    assert {"gcs_server", "raylet"} <= {name for _, name, _, _ in seen}, sorted(seen)
    assert any(name.startswith("ray::RankActor") for _, name, _, _ in seen), sorted(seen)  # the store, gloo
    assert all(is_loopback(addr) for _, _, addr, _ in seen), sorted(seen)


def test_a_cluster_address_that_does_not_answer_fails_at_once_naming_it() -> None:
    # Ray itself retried a closed port for more than 7 minutes, saying nothing.
    port = free_port()  # nothing listens there
    env = child_env(RAY_ADDRESS=f"127.0.0.1:{port}")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tp_runtime.cli", "run", TINY], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"RAY_ADDRESS=127.0.0.1:{port}" in errors[0], r.stderr[-3000:]
    assert time.monotonic() - t0 < 60 and not reap(env[MARK], 0)


def test_embedded_ray_ends_with_a_driver_killed_by_sigkill() -> None:
    # No shutdown runs in a SIGKILLed driver. Ray's fate sharing ends its GCS, raylet and workers, but
    # its DashboardAgent and RuntimeEnvAgent lingered 60-65 s (measured); the embedded instance's
    # reaper (parallel/ray_reaper.py) ends them: measured, every process gone within 5 s of the kill.
    env = child_env()
    p = subprocess.Popen([sys.executable, "-m", "tp_runtime.cli", "run", TINY, "workload.requests=512"], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:  # the placement line: Ray is up and both ranks are running
            if line.startswith("tp_runtime ray:"):
                break
        assert p.poll() is None, "the run ended before it could be killed"
        p.kill()
        p.wait(timeout=10)
        t0 = time.monotonic()
        deadline = t0 + 15  # the reaper acts at once; Ray's own fate sharing takes a few seconds more
        while marked(env[MARK]) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in marked(env[MARK])
                if Path(f"/proc/{pid}/comm").exists()}
    finally:
        reap(env[MARK], 0)
        p.stderr.close()
    assert not left, f"Ray processes alive {time.monotonic() - t0:.0f} s after the driver's SIGKILL: {left}"


@pytest.fixture(scope="class")
def embedded():
    """One embedded Ray (2 CPUs, as on a 2-core machine) for the failure tests of a class; all of its
    processes (its reaper included) must be gone after it stops."""
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark  # inherited by every Ray process started from here
    instance = None
    try:
        instance = ray_launch.start_embedded(num_cpus=2, num_gpus=0)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield
    finally:
        if instance is not None:
            instance.stop()
        del os.environ[MARK]
        left = reap(mark)
        assert not left, f"Ray processes left behind: {left}"


def _resources_released(total_cpus: float, within_s: float) -> bool:
    """All CPUs available again: the placement group is removed and the actors are gone."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) == total_cpus:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.usefixtures("embedded")
class TestEmbeddedFailures:
    def test_rank_death_fails_run_naming_rank(self) -> None:
        # Rank 1 SIGKILLs itself as step 5 begins (parallel.fail_rank / fail_step, testing keys); rank 0
        # is then in a collective with a dead peer. The driver must name rank 1 and its death.
        cfg = load_config(TINY, ["parallel.launcher=ray", "runtime.device=cpu",
                                 "parallel.fail_rank=1", "parallel.fail_step=5"])
        t0 = time.monotonic()
        with pytest.raises(LaunchError, match=r"rank 1 \(node .*\) died: its process exited") as e:
            ray_launch.launch_ray(cfg, worker_entry)
        elapsed = time.monotonic() - t0
        # Bound: actor start (torch import) ~10 s on a loaded 2-core machine + 5 steps + POLL_S +
        # FAILURE_GRACE_S; 60 s is the promise, far below parallel.timeout_s-driven hangs.
        assert elapsed < 60, f"failure took {elapsed:.1f} s: {e.value}"
        assert _resources_released(2.0, within_s=10), ray.available_resources()

    def test_unsatisfiable_placement_is_refused_before_placing_anything(self) -> None:
        # tp = 4 CPU bundles, STRICT_PACK, on a 2-CPU instance: can never fit, refused at once (exit status 2).
        cfg = load_config(TINY, ["parallel.launcher=ray", "runtime.device=cpu", "parallel.tp=4"])
        t0 = time.monotonic()
        with pytest.raises(LaunchRefused) as e:
            ray_launch.launch_ray(cfg, worker_entry)
        msg = str(e.value)
        assert "can never hold 4 bundle(s) of {CPU: 1} with strategy STRICT_PACK" in msg, msg
        assert "{CPU: 2" in msg and "1 node(s)" in msg, msg  # what the cluster has
        assert time.monotonic() - t0 < 5
        assert ray.util.placement_group_table() == {} or all(
            pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())

    def test_busy_placement_times_out_with_what_was_asked(self) -> None:
        # The CPUs exist but another placement group holds them: waited for parallel.placement_timeout_s.
        held = ray.util.placement_group([{"CPU": 2.0}])
        ray.get(held.ready(), timeout=30)
        try:
            cfg = load_config(TINY, ["parallel.launcher=ray", "runtime.device=cpu", "parallel.placement_timeout_s=3"])
            t0 = time.monotonic()
            with pytest.raises(LaunchError) as e:
                ray_launch.launch_ray(cfg, worker_entry)
            elapsed = time.monotonic() - t0
        finally:
            ray.util.remove_placement_group(held)
        msg = str(e.value)
        assert not isinstance(e.value, LaunchRefused), msg
        assert "not ready after 3 s" in msg and "2 bundle(s) of {CPU: 1}" in msg and "STRICT_PACK" in msg, msg
        assert 3 <= elapsed < 15, elapsed  # the timeout, plus describing and removing the group
        assert _resources_released(2.0, within_s=10), ray.available_resources()

    def test_cuda_without_gpus_is_refused_before_placement(self) -> None:
        cfg = load_config(TINY, ["parallel.launcher=ray", "runtime.device=cuda"])
        with pytest.raises(LaunchRefused, match=r"runtime.device=cuda but the Ray cluster has no GPU .*\{CPU: 2\}"):
            ray_launch.launch_ray(cfg, worker_entry)


# ---------------------------------------------------------------- a real cluster: head + one more node


@pytest.fixture(scope="class")
def cluster():
    """A head (2 CPUs, dashboard for job submission) and a second node (1 CPU), each a `ray start
    --block` process started through launch/ray_cluster.sh, with a private token.

    Each node has its own temp dir, as each machine of a real cluster has its own disk. Sharing one, the
    two nodes shared one runtime_resources folder: a node unpacking a job's working_dir deletes the
    folder first, so the second node's unpacking deleted it under the head's ranks, whose `import torch`
    then ended with "Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so" (MKL's loader stops when
    getcwd() fails)."""
    token = uuid.uuid4().hex
    env = child_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY=f"{sys.executable} -m ray.scripts.scripts",
                    RAY_PORT=str(free_port()), DASHBOARD_PORT=str(free_port()), DASHBOARD_HOST="127.0.0.1")
    env.pop("PYTHONPATH")  # nodes import tp_runtime only as shipped by the job or the driver
    temps = [f"/tmp/rtp_{token[:8]}_{node}" for node in ("head", "node2")]  # private: no other ray.init finds them
    common = ["--block", f"--dashboard-agent-listen-port={free_port()}"]
    script = str(REPO / "launch" / "ray_cluster.sh")
    procs = [subprocess.Popen([script, "head", "--num-cpus=2", f"--ray-client-server-port={free_port()}",
                               f"--temp-dir={temps[0]}", *common], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        gcs = f"127.0.0.1:{env['RAY_PORT']}"
        _wait_nodes(gcs, 1, env)
        procs.append(subprocess.Popen([script, "join", gcs, "--num-cpus=1", f"--temp-dir={temps[1]}", *common],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_nodes(gcs, 2, env)
        yield {"gcs": gcs, "dashboard": f"http://127.0.0.1:{env['DASHBOARD_PORT']}", "env": env, "token": token,
               "temps": temps}
    finally:
        stop(list(reversed(procs)))
        left = reap(env[MARK])
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray cluster processes left behind: {left}"


def _wait_nodes(gcs: str, n: int, env: dict[str, str], timeout_s: float = 90) -> None:
    code = ("import ray, time; ray.init(logging_level='ERROR')\n"
            f"while sum(x['Alive'] for x in ray.nodes()) < {n}: time.sleep(0.2)")
    subprocess.run([sys.executable, "-c", code], env={**env, "RAY_ADDRESS": gcs}, check=True,
                   timeout=timeout_s, capture_output=True)


@pytest.mark.usefixtures("cluster")
class TestCluster:
    def test_strict_spread_places_ranks_on_two_nodes(self, cluster: dict, local_checksum: float) -> None:
        env = {**cluster["env"], "RAY_ADDRESS": cluster["gcs"], "PYTHONPATH": str(REPO)}
        r = run_cli(["run", TINY, "parallel.placement_strategy=STRICT_SPREAD"], timeout_s=300, env=env)
        assert r.returncode == 0, r.stderr[-4000:]
        where = placements(r.stderr)
        assert sorted(where) == [0, 1], r.stderr[-2000:]
        assert where[0][1] != where[1][1], f"both ranks on node {where[0][1]}"
        assert last_json(r.stdout)["output_checksum"] == local_checksum

    def test_ray_job_submit_finds_the_token_as_ray_does(self, cluster: dict, local_checksum: float,
                                                         tmp_path) -> None:
        # As the README runs it against a token-auth head: the token only in ~/.ray/auth_token (a
        # private HOME here), neither RAY_AUTH_MODE nor RAY_AUTH_TOKEN set; the script sets the mode.
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text(cluster["token"])
        job = f"tp-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in cluster["env"].items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        env.update(HOME=str(tmp_path), RAY_ADDRESS=cluster["dashboard"], PYTHON=sys.executable,
                   RAY_SUBMIT_ARGS=f"--submission-id {job}")
        r = subprocess.run([str(REPO / "launch" / "ray_submit.sh"), TINY, "workload.prompt_len=[16, 300]"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        env = {**cluster["env"], "RAY_ADDRESS": cluster["dashboard"]}  # the head's own token, for the logs
        logs = subprocess.run([*env["RAY"].split(), "job", "logs", job, "--address", cluster["dashboard"]],
                              env=env, capture_output=True, text=True, timeout=60)
        rec = last_json(logs.stdout)
        assert rec["launcher"] == "ray" and rec["output_checksum"] == local_checksum
        assert "tp_runtime ray: 2 x {CPU: 1} STRICT_PACK" in logs.stdout + logs.stderr

    def test_each_node_unpacks_runtime_envs_in_its_own_folder(self, cluster: dict) -> None:
        # Two nodes on one machine must not share runtime_resources (see the cluster fixture).
        folders = [(Path(temp) / "session_latest" / "runtime_resources").resolve() for temp in cluster["temps"]]
        assert all(f.is_dir() for f in folders) and folders[0] != folders[1], folders

    def test_dashboard_listens_where_dashboard_host_says(self, cluster: dict) -> None:
        port = int(cluster["dashboard"].rsplit(":", 1)[1])
        on_port = [x for x in listeners(marked(cluster["env"][MARK])) if x[3] == port]
        assert on_port and all(addr == "127.0.0.1" for _, _, addr, _ in on_port), on_port


# ---------------------------------------------------------------- GPUs (pytest -m gpu, two GPUs)


@pytest.mark.gpu
def test_gpu_smoke_ray_and_torchrun_nccl(tmp_path) -> None:
    """launch/gpu_smoke.sh: tp = 2 with NCCL through Ray and torchrun, eager and breakable graphs."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    r = subprocess.run([str(REPO / "launch" / "gpu_smoke.sh")], env=child_env(OUT=str(tmp_path)),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    runs = {rec["run"]: rec for rec in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert set(runs) == {"ray_eager", "torchrun_eager", "ray_breakable", "torchrun_breakable"}
    assert all(rec["rc"] == 0 and rec["device"].startswith("cuda") for rec in runs.values()), runs


def test_embedded_ray_under_a_long_temporary_folder_is_refused_before_it_starts(tmp_path) -> None:
    # Ray's socket paths live under RAY_TMPDIR / TMPDIR; past the 107 bytes of a Unix socket path its start ended in
    # a traceback. Refused first, naming the folder and how long it may be.
    from conftest import assert_refused

    long_dir = tmp_path / ("t" * 80)
    long_dir.mkdir()
    r = subprocess.run([sys.executable, "-m", "tp_runtime.cli", "run", TINY, "parallel.launcher=ray"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=child_env(TMPDIR=str(long_dir)))
    line = assert_refused(r, "parallel.launcher=ray", f"TMPDIR={long_dir}", "RAY_TMPDIR")
    assert "107" in line
