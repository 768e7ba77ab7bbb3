"""The tensor-parallel group as a value: rank, size, device and process groups, passed explicitly.

There is no module-global rank state: a tp = 1 group and a shard's group can live in one process.
`init_from_env` joins the group a launcher prepared (torchrun, the elastic agent, Ray actors all set
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT); `shutdown` tears it down in the order
that cannot hang (graphs first, then the process group).

What listens: where the ranks host their own store (no launcher store: Ray), rank 0's store listens
on MASTER_ADDR only (store.py), not on every interface as torch's would; when every rank runs on this
machine (LOCAL_WORLD_SIZE == WORLD_SIZE), gloo's sockets use the loopback interface
(GLOO_SOCKET_IFNAME, unless set) instead of the address the host name resolves to.

Joining: such ranks start at different moments (on a loaded machine, seconds apart), so they first meet at
that store, waiting up to RENDEZVOUS_TIMEOUT_S (or parallel.timeout_s if longer) for each other; the process group
then forms with parallel.timeout_s, the bound on a peer that stops answering once the run is under way.

The layer all-reduce goes through the strategy the group carries (`allreduce`, parallel/allreduce.py), set
once at start-up by setup_allreduce before any capture; without one it is the backend's all-reduce.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist

from tp_runtime.parallel.store import listening_store

if TYPE_CHECKING:
    from tp_runtime.parallel.allreduce import AllReduce

RENDEZVOUS_TIMEOUT_S = 180.0  # ranks meeting at their store: start skew, not a hang (as Ray allows an actor's start)


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    device: torch.device
    group: dist.ProcessGroup | None = None  # device collectives: NCCL on GPUs, gloo on CPU
    cpu_group: dist.ProcessGroup | None = None  # host-side broadcasts (step plans), always gloo
    local_size: int | None = None  # ranks on this rank's node (LOCAL_WORLD_SIZE at init); None: not said
    allreduce: AllReduce | None = None  # the layer all-reduce chosen at start-up (setup_allreduce)

    @property
    def has_peers(self) -> bool:
        """Other ranks to meet and reduce with. False at tp = 1 and for a rank's shard built alone (no process
        group: the bench's projected points, bench/projection.py, whose all-reduce is a no-op)."""
        return self.size > 1 and self.cpu_group is not None

    def shard(self, n: int, what: str) -> tuple[int, int]:
        """[start, end) of this rank's equal share of n items."""
        if n % self.size:
            raise ValueError(f"{what}={n} is not divisible by tp={self.size}")
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """In-place sum over the group; the one collective of a layer (the group's strategy, if set)."""
        if self.size > 1:
            if self.allreduce is not None:
                return self.allreduce(x)
            dist.all_reduce(x, group=self.group)
        return x

    def broadcast_from_driver(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's host tensor, delivered in place to every rank."""
        if self.size > 1:
            dist.broadcast(t, src=0, group=self.cpu_group)
        return t

    def gather_to_driver(self, value: object) -> list | None:
        """Every rank's picklable value, as a list on rank 0 (None elsewhere)."""
        if self.size == 1:
            return [value]
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.cpu_group)
        return out


def resolve_device(kind: str, local_rank: int = 0) -> torch.device:
    """'auto' | 'cpu' | 'cuda' -> a concrete device for this rank."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("runtime.device=cuda but CUDA is not available on this machine")
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise RuntimeError(f"local rank {local_rank} needs GPU {local_rank}, but this node has {n} GPU(s)")
    return torch.device("cuda", local_rank)


def single_process(device: torch.device) -> TPGroup:
    """tp = 1 without any process group (tests, the tp = 1 side of `check`)."""
    return TPGroup(rank=0, size=1, device=device)


def init_from_env(device_kind: str, backend: str, timeout_s: float) -> TPGroup:
    """Join the process group described by the launcher's environment variables."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = resolve_device(device_kind, local_rank)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise RuntimeError("parallel.backend=nccl needs every rank on a GPU")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # the ranks host their store: rank 0
        kwargs["store"] = _rank_store(rank, world, timeout)
    if int(os.environ.get("LOCAL_WORLD_SIZE", "-1")) == world and "lo" in dict(socket.if_nameindex()).values():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks here: gloo on 127.0.0.1
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **kwargs)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return TPGroup(rank=rank, size=world, device=device, group=dist.group.WORLD, cpu_group=cpu_group,
                   local_size=int(local) if local else None)


def _rank_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT (served by rank 0 on that address only), once every rank
    has reached it, each waiting up to RENDEZVOUS_TIMEOUT_S (or `timeout` if longer); from then on its calls wait
    up to `timeout` (parallel.timeout_s), as the group's do. Connecting and meeting within parallel.timeout_s
    instead failed a run on a loaded machine: rank 1 gave up connecting after 10 s, before rank 0's store was up."""
    join = max(timeout, timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = listening_store(host, port, join, world) if rank == 0 else dist.TCPStore(host, port, world, False, join)
    store.set(f"tp_runtime/joined/{rank}", "1")
    store.wait([f"tp_runtime/joined/{r}" for r in range(world)], join)
    store.set_timeout(timeout)
    return store


def group_from_env(device_kind: str, backend: str, timeout_s: float) -> TPGroup:
    """The group a launcher prepared (RANK set), or tp = 1 in this very process (no RANK)."""
    if "RANK" in os.environ:
        return init_from_env(device_kind, backend, timeout_s)
    return single_process(resolve_device(device_kind))


def warm_up_collectives(tp: TPGroup) -> None:
    """Eager all-reduces before any graph capture, then a barrier: NCCL's communicator exists (4 bytes take
    NCCL) and the group's symmetric-memory path ran once and summed right (4 KB take it where the group has
    one), on every rank before any rank captures."""
    if tp.has_peers:
        for n in (1, 1024):
            x = torch.ones(n, device=tp.device)
            tp.all_reduce(x)
            if not bool((x == tp.size).all()):
                raise RuntimeError(f"warm-up all-reduce of {n} ones summed to {x.max().item()}, expected {tp.size}")
        dist.barrier(group=tp.cpu_group)


def shutdown(tp: TPGroup, release: Callable[[], None] | None = None) -> None:
    """Free graphs (via `release`) before destroying the process group: the reverse order hangs NCCL.

    With a symmetric-memory all-reduce, waiting on the device is bounded: its kernels spin on their peers
    without a timeout, so after a peer was lost one may never finish; past the strategy's drain_s
    (parallel.timeout_s) this process says so and exits with status 1 instead of hanging."""
    if release is not None:
        release()
    gc.collect()
    guard = _drain_guard(tp)
    try:
        if tp.device.type == "cuda":
            torch.cuda.synchronize(tp.device)
        if tp.size > 1 and dist.is_initialized():
            dist.destroy_process_group()
    finally:
        if guard is not None:
            guard.cancel()


def _drain_guard(tp: TPGroup) -> threading.Timer | None:
    """A timer that ends this process if the device does not drain within the strategy's drain_s."""
    ar = tp.allreduce
    if ar is None or not ar.uses_symm:
        return None

    def give_up() -> None:
        print(f"tp_runtime: rank {tp.rank}: the device did not drain within {ar.drain_s:g} s at shutdown (a "
              "symmetric-memory all-reduce waits for a lost peer); exiting", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(ar.drain_s, give_up)
    timer.daemon = True
    timer.start()
    return timer
