"""Start the ranks of a run and return rank 0's result.

    local     tp = 1 runs in this process; tp > 1 starts one process per rank through torch's
              elastic agent (the machinery behind torchrun), the workers' store on 127.0.0.1
    ray       one actor per rank in a placement group (ray_launch.py)
    torchrun  the processes already exist: run `torchrun ... -m tp_runtime.engine.entry CONFIG`

check_launchable(cfg) refuses, before anything starts, what run_on_ranks cannot start from this process.

Every path calls the given per-rank entry (`engine.entry.worker_entry`, `bench.entry.bench_entry`) with
the config dict first: the same code on every rank. This module imports no engine code.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from datetime import timedelta
from typing import Any, Callable

from tp_runtime.config import ConfigError, RunConfig
from tp_runtime.parallel.errors import LaunchError
from tp_runtime.parallel.agent_signals import agent_handles, agent_signals
from tp_runtime.parallel.interrupt import Interrupted, quiet_rank_exit

ENTRY_MODULE = "tp_runtime.engine.entry"  # the run's torchrun entry (the bench's: tp_runtime.bench)
RENDEZVOUS_TIMEOUT_S = 900  # the workers' store: every rank must reach it within this (torch's default)


def run_on_ranks(cfg: RunConfig, entry: Callable[..., Any], *args: Any,
                 torchrun_module: str = ENTRY_MODULE) -> Any:
    """entry(cfg_dict, *args) on every rank of cfg.parallel.tp under cfg.parallel.launcher; rank 0's
    return value. Every per-rank entry (worker_entry, bench_entry) takes the config dict first."""
    p = cfg.parallel
    if p.launcher == "ray":
        from tp_runtime.parallel.ray_launch import launch_ray

        return launch_ray(cfg, entry, args)
    if p.launcher == "torchrun":  # the command line refuses it first (check_launchable: exit status 2)
        raise LaunchError(_torchrun_advice(torchrun_module))
    if p.tp == 1:
        return entry(cfg.to_dict(), *args)
    return run_elastic(p.tp, entry, (cfg.to_dict(), *args))


def check_launchable(cfg: RunConfig, torchrun_module: str = ENTRY_MODULE) -> None:
    """ConfigError, before anything starts, for a launch that run_on_ranks cannot make from this process: the
    torchrun launcher (torchrun starts the ranks), fault injection at tp = 1, where no peer rank would name
    the faulty one (and under the local launcher the faulty rank is this very process), and too few GPUs on
    this machine for its ranks."""
    p = cfg.parallel
    if p.launcher == "torchrun":
        raise ConfigError(f"{cfg.origin('parallel.launcher')}: {_torchrun_advice(torchrun_module)}, "
                          "or use parallel.launcher=local or ray")
    if p.fail_rank is not None and p.tp == 1:
        raise ConfigError(f"{cfg.origin('parallel.fail_rank')}: fault injection 'parallel.fail_rank'={p.fail_rank} "
                          f"needs a peer rank (parallel.tp={p.tp}): the faulty rank is named by its peers")
    _check_local_gpus(cfg)
    _check_ray_socket_paths(cfg)


# What an embedded Ray's longest socket path adds to its temporary folder: "/ray/session_<date>_<time>_<us>_<pid>"
# (the pid of this process, which starts it) then "/sockets/plasma_store"; Unix socket paths hold 107 bytes.
RAY_SESSION_DATE = len("2026-12-02_07-48-14_047700")
UNIX_SOCKET_PATH_MAX = 107


def ray_temp_dir() -> str:
    """Where Ray puts an embedded instance's files on Linux: RAY_TMPDIR, else TMPDIR, else /tmp (Ray's own rule)."""
    return os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"


def _check_ray_socket_paths(cfg: RunConfig) -> None:
    """An embedded Ray under a temporary folder so long that its socket paths would pass the Unix limit: refused
    here, naming the folder, rather than by Ray's start with a traceback."""
    if cfg.parallel.launcher != "ray" or os.environ.get("RAY_ADDRESS"):
        return
    tmp = ray_temp_dir().rstrip("/")
    longest = len(tmp) + len(f"/ray/session__{os.getpid()}/sockets/plasma_store") + RAY_SESSION_DATE
    if longest > UNIX_SOCKET_PATH_MAX:
        room = UNIX_SOCKET_PATH_MAX - (longest - len(tmp))
        var = "RAY_TMPDIR" if os.environ.get("RAY_TMPDIR") else "TMPDIR"
        raise ConfigError(f"{cfg.origin('parallel.launcher')}: an embedded Ray (parallel.launcher=ray) keeps its "
                          f"sockets under {var}={tmp} ({len(tmp)} characters), which makes them {longest} bytes long, "
                          f"past the {UNIX_SOCKET_PATH_MAX} of a Unix socket path: set RAY_TMPDIR to a folder of at "
                          f"most {room} characters")


def _check_local_gpus(cfg: RunConfig) -> None:
    """runtime.device=cuda under the local launcher or an embedded Ray (no RAY_ADDRESS): every rank runs on
    this machine, one GPU each; checked before any process is started. (A Ray cluster's GPUs are checked
    against its resources before anything is placed: ray_launch.check_fits.)"""
    import torch

    embedded_ray = cfg.parallel.launcher == "ray" and not os.environ.get("RAY_ADDRESS")
    if cfg.runtime.device != "cuda" or not (cfg.parallel.launcher == "local" or embedded_ray):
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    tp, launcher = cfg.parallel.tp, cfg.parallel.launcher
    if have < tp:
        where = "an embedded Ray on this machine" if embedded_ray else "parallel.launcher=local"
        raise ConfigError(f"{cfg.origin('runtime.device')}: runtime.device=cuda with parallel.tp={tp} under "
                          f"{where} (parallel.launcher={launcher}) needs {tp} GPU(s) on this machine; "
                          f"{f'it has {have}' if have else 'CUDA is not available here'} "
                          "(use runtime.device=auto or cpu)")


def _torchrun_advice(module: str) -> str:
    nodes = " (launch/torchrun_multinode.sh for several nodes)" if module == ENTRY_MODULE else ""
    return ("parallel.launcher=torchrun: this command does not start torchrun's processes; start the ranks with "
            f"`python -m tp_runtime.parallel.torchrun_main --nproc-per-node N -m {module} CONFIG [key=value ...]`"
            f"{nodes}")


def run_elastic(nproc: int, entry: Callable[..., Any], args: tuple) -> Any:
    """entry(*args) in nproc processes on this host through torch's elastic agent; rank 0's return value.
    The workers' store listens on 127.0.0.1 only (store.LoopbackRendezvous). A failing rank ends the
    run with LaunchError naming every failed rank, and the peer a rank found silent (heartbeat.py)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tp_runtime.parallel.heartbeat import read_lost
    from tp_runtime.parallel.store import LOOPBACK_BACKEND, listening_store

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    # A failed rank is reported in one line (LaunchError); torch's own traceback of it, and its notice
    # that it terminates the other ranks, would come before that line.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    _start_resource_tracker_quietly()
    store = listening_store("127.0.0.1", 0, timedelta(seconds=RENDEZVOUS_TIMEOUT_S))  # port 0: a free one
    lc = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc,
        run_id=f"tp-runtime-{uuid.uuid4().hex[:8]}",
        rdzv_backend=LOOPBACK_BACKEND, rdzv_endpoint=f"127.0.0.1:{store.port}", rdzv_configs={"store": store},
        max_restarts=0, monitor_interval=0.1, start_method="spawn",
        **agent_handles(),  # SIGINT / SIGTERM / SIGHUP: agent_signals
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    rank_main = functools.update_wrapper(functools.partial(_rank_main, entry), entry)  # the agent logs its name
    try:
        with agent_signals():  # a signal ends every worker, and none in the middle of its start
            return elastic_launch(lc, rank_main)(*args)[0]
    except SignalException as e:  # the agent got a signal and has ended its workers
        raise Interrupted(e.sigval) from None
    except ChildFailedError as e:
        first, _ = e.get_first_failure()
        ranks = [first] + sorted(r for r in e.failures if r != first)
        failed = "; ".join(f"rank {r} failed (exit code {e.failures[r].exitcode}): "
                           f"{_failure_message(e.failures[r])}" for r in ranks)
        lost = read_lost(store)  # what a rank found and recorded before the agent stopped the rest
        raise LaunchError(f"{failed}{f'; {lost}' if lost and lost not in failed else ''}") from None


def _start_resource_tracker_quietly() -> None:
    """multiprocessing's resource tracker (one per launching process, shared by its spawned ranks) unlinks
    the semaphores of a rank that was killed before it could (tqdm's lock in a bench rank); its warning about
    them would follow the run's `error:` line. It is started here, with that one warning filtered out, and
    SIGHUP ignored (it ignores SIGINT / SIGTERM itself): a hang-up of the terminal's group would end it before
    the ranks, whose semaphores it then no longer knows (KeyErrors on stderr)."""
    import signal
    from multiprocessing import resource_tracker

    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, "ignore:resource_tracker:UserWarning"]))
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited through exec: the tracker ignores it
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, hup)
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def _rank_main(entry: Callable[..., Any], *args: Any) -> Any:
    """A local rank process: a signal, or the launcher's death, ends it quietly (the launcher reports it), then
    the entry runs."""
    quiet_rank_exit()
    return entry(*args)


def _failure_message(failure) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", msg)
        if isinstance(msg, dict):
            msg = msg.get("message", str(msg))
    return str(msg).strip().splitlines()[-1] if msg else "no error message (killed by a signal?)"
