"""Ray launcher: one actor per rank in one placement group, every actor running the per-rank entry
(`engine.entry.worker_entry` for runs, `bench.entry.bench_entry` for benchmarks).

    launch_ray(cfg)    RAY_ADDRESS unset: an embedded Ray on 127.0.0.1 (tp logical CPUs, no dashboard)
                       RAY_ADDRESS set (as under `ray job submit`): join that cluster, shipping this
                       tp_runtime package to its workers (runtime_env py_modules); a host:port that
                       accepts no connection within JOIN_TIMEOUT_S is a LaunchError naming it
    -> placement group: one bundle per rank, {"GPU": 1, "CPU": 1} when the cluster has GPUs and
       runtime.device is not cpu, {"CPU": 1} otherwise; strategy parallel.placement_strategy,
       waited for at most parallel.placement_timeout_s
    -> ranks ordered by node (node IP, node id, bundle index); LOCAL_RANK = position on its node
    -> rendezvous at rank 0's node address, on a port rank 0's actor picks (binds port 0)
    -> each actor sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT
       and runs worker_entry; the driver polls every rank (ray.wait), returns rank 0's result, and on
       the first failure kills the others and raises LaunchError naming the rank and the cause

Actors, the placement group and (when started here) Ray itself are released on every path.
GPU actors see all of their node's GPUs (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1: Ray's
per-actor masking makes NCCL crawl or hang on some hosts) and pick theirs by local rank.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

# An embedded Ray (no cluster address) stays on this machine: with clusters switched off (Ray's own
# mode on laptops) this process's Ray gives every server it starts 127.0.0.1 to bind and advertise.
# Ray reads the switch once, when first imported, so it is set around the import and removed again:
# child processes (a `ray start` node, torchrun) must not inherit it. A process that imported Ray
# before this module, or that joins a cluster (RAY_ADDRESS), keeps Ray's own choice of address.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_local_only = "ray" not in sys.modules and not os.environ.get("RAY_ADDRESS") and LOCAL_ONLY_ENV not in os.environ
if _local_only:
    os.environ[LOCAL_ONLY_ENV] = "0"
import ray  # noqa: E402

if _local_only:
    del os.environ[LOCAL_ONLY_ENV]
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError  # noqa: E402
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

import tp_runtime  # noqa: E402
from tp_runtime.config import RunConfig  # noqa: E402
from tp_runtime.parallel.errors import LaunchError, LaunchRefused  # noqa: E402
from tp_runtime.parallel import ray_reaper  # noqa: E402
from tp_runtime.parallel.interrupt import SIGNALS  # noqa: E402

# NVLink multicast off by default (it hangs or is unavailable on the hosts this runs on); a value
# in the driver's environment wins. TORCH_NCCL_ASYNC_ERROR_HANDLING=3: a collective past
# parallel.timeout_s ends the process instead of hanging it (torch's default, stated for old versions).
ACTOR_ENV_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                      "NVSHMEM_DISABLE_NVLS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
PASSED_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
EMBEDDED_OBJECT_STORE_BYTES = 256 * 2**20  # results and step plans are small; Ray's minimum is 75 MiB
ACTOR_START_TIMEOUT_S = 180.0  # actor process up, tp_runtime and torch imported (runtime env included)
POLL_S = 1.0  # the driver's ray.wait period: bounds how late it notices a failed rank
# after the first failure, time for the other ranks' causes to arrive (the wait ends as soon as every rank has
# ended). A rank that SIGKILLs a stopped peer (heartbeat.py) is seen dead first, and the cause comes from its
# killer: 1.5 s later on two idle cores, over 3 s on loaded ones, where the error then said only "died"
FAILURE_GRACE_S = 10.0
JOIN_TIMEOUT_S = 20.0  # RAY_ADDRESS=host:port must accept a connection within this (Ray itself retries for minutes)


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs: its bundle of the placement group, node and process."""

    rank: int
    local_rank: int
    local_world_size: int
    bundle: int
    node_ip: str
    node_id: str
    pid: int

    def describe(self) -> str:
        return f"rank {self.rank} (node {self.node_ip} id {self.node_id[:8]}, pid {self.pid})"


class RankActor:
    """One rank's process: says where it runs, picks the rendezvous port (rank 0), runs the worker."""

    def where(self) -> tuple[str, str, int]:
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(), os.getpid()

    def free_port(self) -> int:
        with socket.socket() as s:  # port 0: the OS picks a free one on this node
            s.bind(("", 0))
            return s.getsockname()[1]

    def run(self, env: dict[str, str], entry: Callable[..., Any], args: tuple) -> Any:
        os.environ.update(env)  # read once by distributed.init_from_env
        return entry(*args)


# ---------------------------------------------------------------- connecting


class EmbeddedRay:
    """A private Ray instance on this machine: loopback only, no dashboard, `num_cpus` logical CPUs.
    `stop()` shuts it down and has the reaper end any of its processes still alive; if this process dies
    instead, or is interrupted during ray.init, the reaper ends them too (parallel/ray_reaper.py)."""

    def __init__(self, num_cpus: int, num_gpus: int | None = None):
        self._reaper = _start_reaper()
        try:
            with _quiet_token_notice():
                ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                         object_store_memory=EMBEDDED_OBJECT_STORE_BYTES, logging_level=logging.WARNING)
        except KeyboardInterrupt:  # a signal, maybe to the whole group: Ray's servers may be dying, no call to them
            self.reap()
            raise
        except BaseException:  # what ray.init started is ended before its error propagates
            self.stop()
            raise
        finally:  # Ray's servers inherited the mark; whatever ray.init did, what this process starts later must not
            os.environ.pop(ray_reaper.OWNER_ENV, None)

    def stop(self) -> None:
        try:
            ray.shutdown()
        finally:
            self.reap()

    def reap(self) -> None:
        """Have the reaper SIGKILL every process of this Ray that is still alive, and wait for it: after a
        signal to the whole process group, Ray's own servers may be dying too, and any call to them (killing
        actors, removing the placement group, ray.shutdown) would wait out Ray's 60 s timeouts."""
        if self._reaper.poll() is None:
            self._reaper.stdin.close()  # EOF: it ends what is left of this Ray, then exits
            self._reaper.wait(timeout=30)


def _start_reaper() -> subprocess.Popen:
    """The reaper of this process's embedded Ray (`python -m tp_runtime.parallel.ray_reaper`), its stdin a pipe
    from here: closing it, or this process's death, tells it to end what is left. It runs the tp_runtime this
    process imported, wherever that was found (its root leads the reaper's PYTHONPATH); in a session of its
    own, so that a signal to this command's process group does not reach it. This process's environment gets
    the Ray's mark (ray_reaper.OWNER_ENV, a fresh value), which every process ray.init starts inherits."""
    owner = uuid.uuid4().hex
    os.environ[ray_reaper.OWNER_ENV] = owner
    root = os.path.dirname(os.path.dirname(tp_runtime.__file__))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-m", "tp_runtime.parallel.ray_reaper", str(os.getpid()), ray.__file__,
                             owner], stdin=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path},
                            start_new_session=True)


@contextmanager
def _quiet_token_notice():
    """Ray's notice about token authentication, logged as a WARNING by every ray.init that starts a local
    instance, says nothing about this one: it is private to this run and listens on 127.0.0.1 only."""
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice.setLevel(level)


def start_embedded(num_cpus: int, num_gpus: int | None = None) -> EmbeddedRay:
    """Start an embedded Ray (EmbeddedRay); the caller stops it."""
    return EmbeddedRay(num_cpus, num_gpus)


def connect(cfg: RunConfig) -> EmbeddedRay | None:
    """Join RAY_ADDRESS's cluster, or start an embedded Ray (returned, for the caller to stop)."""
    if ray.is_initialized():
        return None
    if not sys.stderr.isatty():  # the ranks' lines Ray forwards here: no colour codes in a file or pipe
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    address = os.environ.get("RAY_ADDRESS")
    with _keep_signal_handlers():
        return _connect(cfg, address)


def check_reachable(address: str, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """LaunchError naming the address when a cluster's GCS (RAY_ADDRESS=host:port) does not accept a TCP
    connection within timeout_s. Other forms (auto, ray://, http://) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "/" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = "nothing answered" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise LaunchError(f"could not join the Ray cluster at RAY_ADDRESS={address}: {why} "
                          f"(waited at most {timeout_s:g} s)") from None


def _connect(cfg: RunConfig, address: str | None) -> EmbeddedRay | None:
    if address:
        check_reachable(address)
    try:
        if address:  # ray.init reads RAY_ADDRESS; the cluster's workers get this very tp_runtime
            package = os.path.dirname(tp_runtime.__file__)
            ray.init(logging_level=logging.WARNING, runtime_env={"py_modules": [package]})
            return None
        return start_embedded(cfg.parallel.tp, 0 if cfg.runtime.device == "cpu" else None)
    except (ConnectionError, RuntimeError, ValueError) as e:
        what = f"join the Ray cluster at RAY_ADDRESS={address}" if address else "start an embedded Ray"
        raise LaunchError(f"could not {what}: {type(e).__name__}: {e}") from None


@contextmanager
def _keep_signal_handlers():
    """ray.init puts its own handler on SIGTERM as it starts (sys.exit(15): a silent exit, the embedded Ray
    half-started), and its core worker's later on: within the block Ray may not replace the caller's
    handlers (the command's Interrupted, parallel/interrupt.py), and they are put back afterwards."""
    import signal

    import ray._private.utils as ray_utils

    saved = {s: signal.getsignal(s) for s in SIGNALS}
    ray_set = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = ray_set
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)


# ---------------------------------------------------------------- placement


def _fmt(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU")) + "}"


def cluster_summary() -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = "; ".join(f"{n['NodeManagerAddress']} {_fmt(n['Resources'])}" for n in nodes)
    return (f"the cluster has {_fmt(ray.cluster_resources())} in total, {_fmt(ray.available_resources())} "
            f"available, on {len(nodes)} node(s): {per_node}")


def bundles_for(cfg: RunConfig) -> list[dict[str, float]]:
    """One bundle per rank: a GPU and a CPU when the cluster has GPUs (and the run may use them)."""
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    if cfg.runtime.device == "cuda" and not has_gpus:
        raise LaunchRefused(f"runtime.device=cuda but the Ray cluster has no GPU resources; {cluster_summary()}")
    use_gpu = has_gpus and cfg.runtime.device != "cpu"
    return [{"GPU": 1.0, "CPU": 1.0} if use_gpu else {"CPU": 1.0} for _ in range(cfg.parallel.tp)]


def check_fits(bundles: list[dict[str, float]], strategy: str) -> None:
    """LaunchRefused, before anything is placed, when the cluster's nodes (alive, all their resources) can
    never hold the bundles under the strategy. Resources that exist but are in use are waited for (reserve)."""
    need = bundles[0]
    per_node = [min(int(n["Resources"].get(k, 0) // v) for k, v in need.items())
                for n in ray.nodes() if n.get("Alive")]  # bundles each node could hold
    if strategy == "STRICT_PACK":
        fits = max(per_node, default=0) >= len(bundles)
    elif strategy == "STRICT_SPREAD":
        fits = sum(k >= 1 for k in per_node) >= len(bundles)
    else:
        fits = sum(per_node) >= len(bundles)
    if not fits:
        raise LaunchRefused(
            f"the Ray cluster can never hold {len(bundles)} bundle(s) of {_fmt(need)} with strategy {strategy} "
            f"(parallel.tp, parallel.placement_strategy, runtime.device); {cluster_summary()}")


def reserve(bundles: list[dict[str, float]], strategy: str, timeout_s: float) -> PlacementGroup:
    """The placement group, ready; or LaunchError after timeout_s saying what was asked and what exists."""
    pg = placement_group(bundles, strategy=strategy, name=f"tp-runtime-{uuid.uuid4().hex[:8]}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        summary = cluster_summary()
        remove_placement_group(pg)
        raise LaunchError(
            f"Ray placement group not ready after {timeout_s:g} s (parallel.placement_timeout_s): asked "
            f"{len(bundles)} bundle(s) of {_fmt(bundles[0])} with strategy {strategy} "
            f"(parallel.placement_strategy); {summary}")
    return pg


# ---------------------------------------------------------------- ranks


def actor_env(use_gpu: bool) -> dict[str, str]:
    """Environment of every rank actor: NCCL / multicast settings from here, and the GPU visibility rule."""
    env = dict(ACTOR_ENV_DEFAULTS)
    env.update({k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)})
    env["OMP_NUM_THREADS"] = "1"  # one CPU per bundle: one intra-op thread, as Ray would choose
    if use_gpu:
        env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    return env


def _layout(where: list[tuple[str, str, int]]) -> list[RankSlot]:
    """Ranks by node (IP, node id, bundle index), so a node's ranks are consecutive. The local rank
    counts ranks on the same machine (IP): GPU actors see all of the machine's GPUs and take this one."""
    order = sorted(range(len(where)), key=lambda b: (where[b][0], where[b][1], b))
    slots = []
    for rank, b in enumerate(order):
        ip, node, pid = where[b]
        on_node = [x for x in order if where[x][0] == ip]
        slots.append(RankSlot(rank, on_node.index(b), len(on_node), b, ip, node, pid))
    return slots


def _error_of(ref: ray.ObjectRef) -> BaseException | None:
    try:
        ray.get(ref, timeout=0)
    except GetTimeoutError:
        return None
    except Exception as e:  # noqa: BLE001 - any failure of a rank is reported, not re-raised
        return e
    return None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else "no message"


def cause_of(e: BaseException) -> str:
    """A one-line cause: the rank's own exception, or why its process died."""
    if isinstance(e, RayTaskError):
        c = e.cause
        return f"failed: {type(c).__name__}: {_first_line(c)}"
    if isinstance(e, RayActorError):
        msg = str(getattr(e, "error_msg", "") or e)
        m = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common causes|$)", msg, re.S)
        why = f"{m[1]}: {m[2].strip()}" if m else _first_line(msg)
        return f"died: its process exited ({why}; a signal, the OOM killer or a crash)"
    return f"failed: {type(e).__name__}: {_first_line(e)}"


class RankGroup:
    """A placement group and one actor per rank, held in rank order; `close` releases both."""

    def __init__(self, cfg: RunConfig):
        p = cfg.parallel
        self.strategy, self.bundles = p.placement_strategy, bundles_for(cfg)
        self.use_gpu = "GPU" in self.bundles[0]
        self.actors: list = []
        self.pg: PlacementGroup | None = None
        check_fits(self.bundles, self.strategy)

    def start(self, timeout_s: float) -> None:
        """Reserve the placement group, start the actors and order them by rank; the caller closes the group
        on every path."""
        self.pg = reserve(self.bundles, self.strategy, timeout_s)
        self.actors = self._spawn()  # bundle order
        where = self._get([a.where.remote() for a in self.actors], "start the rank actors")
        self.slots = _layout(where)
        self.actors = [self.actors[s.bundle] for s in self.slots]  # rank order

    def _spawn(self) -> list:
        runtime_env: dict = {"env_vars": actor_env(self.use_gpu)}
        actor_cls = ray.remote(RankActor)
        return [actor_cls.options(
            num_cpus=1, num_gpus=1 if self.use_gpu else 0, max_restarts=0, runtime_env=runtime_env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=b),
        ).remote() for b in range(len(self.bundles))]

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs, timeout=ACTOR_START_TIMEOUT_S)
        except GetTimeoutError:
            raise LaunchError(f"could not {what} within {ACTOR_START_TIMEOUT_S:g} s; {cluster_summary()}") from None
        except (RayActorError, RayTaskError) as e:
            raise LaunchError(f"could not {what}: {cause_of(e)}") from None

    def describe(self) -> str:
        ranks = ", ".join(f"rank {s.rank} on {s.node_ip} node {s.node_id[:12]} (local {s.local_rank}/"
                          f"{s.local_world_size}, pid {s.pid})" for s in self.slots)
        return f"tp_runtime ray: {len(self.bundles)} x {_fmt(self.bundles[0])} {self.strategy}: {ranks}"

    def run(self, cfg: RunConfig, entry: Callable[..., Any], args: tuple) -> Any:
        """Every rank runs entry(cfg_dict, *args); returns rank 0's result or raises LaunchError on a failed rank."""
        cfg_dict = cfg.to_dict()
        cfg_dict["runtime"]["device"] = "cuda" if self.use_gpu else "cpu"  # what the bundles hold
        (port,) = self._get([self.actors[0].free_port.remote()], "pick a rendezvous port on rank 0's node")
        common = {"WORLD_SIZE": str(len(self.slots)), "MASTER_ADDR": self.slots[0].node_ip, "MASTER_PORT": str(port)}
        futures = [a.run.remote({**common, "RANK": str(s.rank), "LOCAL_RANK": str(s.local_rank),
                                 "LOCAL_WORLD_SIZE": str(s.local_world_size)}, entry, (cfg_dict, *args))
                   for a, s in zip(self.actors, self.slots)]
        pending = list(futures)
        while pending:  # poll all ranks: a failed one is seen within POLL_S, wherever it is
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            if any(_error_of(f) is not None for f in done):
                ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
                raise LaunchError(self._failures(futures))
        return ray.get(futures[0])

    def _failures(self, futures: list) -> str:
        """Every failed rank with its cause; deaths first (a dead peer makes the others fail too)."""
        errors = [(s, e) for s, f in zip(self.slots, futures) if (e := _error_of(f)) is not None]
        errors.sort(key=lambda se: (not isinstance(se[1], RayActorError), se[0].rank))
        return "; ".join(f"{s.describe()} {cause_of(e)}" for s, e in errors)

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


def launch_ray(cfg: RunConfig, entry: Callable[..., Any], args: tuple = ()) -> Any:
    """Run entry(cfg_dict, *args) on every rank as a Ray actor and return
    rank 0's result; LaunchError names a failed rank."""
    embedded = connect(cfg)
    group: RankGroup | None = None
    try:
        group = RankGroup(cfg)
        group.start(cfg.parallel.placement_timeout_s)
        print(group.describe(), file=sys.stderr, flush=True)
        return group.run(cfg, entry, args)
    except KeyboardInterrupt:
        if embedded is not None:  # a signal to the group may be ending Ray's servers too: no call to them
            embedded.reap()
            group = embedded = None
        raise
    finally:
        if group is not None:
            group.close()
        if embedded is not None:
            embedded.stop()
