"""The layer all-reduce of a TP group: the group's backend (NCCL, gloo on CPU) or torch's symmetric-memory
one-shot / two-shot kernels, chosen once at start-up and carried by the group.

    tp = setup_allreduce(tp, cfg.parallel.allreduce, max_bytes, dtype)   # once, before any graph capture
    tp.all_reduce(x)                                                       # TPGroup dispatches to tp.allreduce

`parallel.allreduce`:
    nccl            the group's backend for every message (NCCL on GPUs, gloo on CPU)
    symm_one_shot   each rank copies its part into a symmetric buffer, reads every peer's and sums (one kernel
                    after the copy: plain peer loads over NVLink, no multicast)
    symm_two_shot   reduce-scatter then all-gather through peer loads and stores (less traffic per rank, two
                    peer barriers more)
    auto            symm_one_shot for messages up to a threshold measured at start-up (NCCL vs one-shot inside
                    a CUDA graph at a few sizes; rank 0's threshold is broadcast, so every rank routes a
                    message the same way), NCCL above it and wherever symmetric memory cannot run

Symmetric memory cannot run (the reason is recorded and logged once on rank 0) on gloo / CPU ranks, at
tp = 1 (nothing to reduce), when the ranks span more than one node (LOCAL_WORLD_SIZE != WORLD_SIZE, read at
start-up), when this node's GPUs lack peer access (torch.cuda.can_device_access_peer), or when this torch
build lacks it. There `auto` takes NCCL; an explicit symm_* value is refused with a ConfigError naming
parallel.allreduce and the reason. Refused, not replaced: an explicit value asks for that kernel (a benchmark
lane, a comparison), and NCCL figures recorded under a symm_* label would be wrong without saying so.

Per message (`route`, host side, from the shape and dtype alone, so equal on every rank and fixed inside a
captured graph): a symm path takes contiguous bf16 / fp32 messages whose bytes are a multiple of 16 (the
kernels' vector width) and fit the buffer (auto: up to the measured threshold); every other message NCCL.

The buffer is allocated and rendezvoused once here, sized by the caller (the largest message a step issues:
tokens x hidden x dtype bytes), capped at MAX_SYMM_BYTES (larger messages are NCCL's anyway).

Failure bound. The kernels' peer barriers (sync_remote_blocks in torch) spin on the device with no timeout,
and the ops take no timeout argument (only the handle's barrier / put_signal / wait_signal do, which these
ops do not call); NCCL's watchdog does not see them. So, with a symm path in use:
  - a rank that dies ends the run through the launcher as before (torchrun / the elastic agent / Ray see the
    dead process and stop the rest), or through the next step's plan broadcast (gloo) failing at once;
  - a rank that hangs is caught by the heartbeat watchdog (heartbeat.Heartbeat.watch): a peer silent for
    parallel.timeout_s is named, killed when on this machine, and this rank exits (status 1);
  - teardown after a failure does not wait on a spinning kernel: group.shutdown waits at most
    DRAIN_LIMIT_S (10 s, or parallel.timeout_s when smaller) for the device, then exits.
Bound: a dead or hung peer ends every rank within parallel.timeout_s + 10 s: the limit of the collective
(gloo's plan broadcast) or of the heartbeat watch, then at most the drain limit. In practice the launcher
ends the rest as soon as one rank has exited (the watch's exit, or the SIGKILL of a silent peer on this
machine), so it is parallel.timeout_s + a few seconds.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tp_runtime.config import ConfigError
from tp_runtime.graph_timer import graph_timing

CHOICES = ("auto", "nccl", "symm_one_shot", "symm_two_shot")
SYMM_PATHS = ("symm_one_shot", "symm_two_shot")
SYMM_DTYPES = (torch.bfloat16, torch.float32)  # what torch's one-shot / two-shot kernels reduce
ALIGN_BYTES = 16  # the kernels' vector width: a message's bytes must be a multiple of it
MAX_SYMM_BYTES = 8 << 20  # buffer cap: above a few MB NCCL's ring is at least as fast on NVLink
PROBE_BYTES = (8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20)  # sizes timed by auto at start-up
DRAIN_LIMIT_S = 10.0  # teardown's wait for the device where a symm path is in use (healthy drains: ms)
PROBE_CALLS, PROBE_REPLAYS = 10, 5  # calls captured back to back per graph; timed replays (median)


class AllReduceError(ConfigError):
    """An explicit parallel.allreduce value that cannot run here; names the key and the reason."""


@dataclass(frozen=True)
class Facts:
    """What decides the group's path: the device backend, ranks, nodes, peer access, this torch build."""

    backend: str  # "nccl" | "gloo"
    world: int
    nodes: int | None  # None: the launcher did not say (no LOCAL_WORLD_SIZE), so possibly several
    peer_access: bool  # every GPU of the node reaches every other's memory
    symm_missing: str | None = None  # why this torch build cannot do symmetric memory; None: it can


def symm_blocker(f: Facts) -> str | None:
    """Why symmetric memory cannot run for this group, or None."""
    if f.backend != "nccl":
        return f"the device backend is {f.backend} (CPU ranks); symmetric memory needs CUDA GPUs with NCCL"
    if f.nodes != 1:
        return (f"the {f.world} ranks span more than one node (LOCAL_WORLD_SIZE != WORLD_SIZE)" if f.nodes
                else "the launcher did not set LOCAL_WORLD_SIZE, so the ranks may span nodes")
    if not f.peer_access:
        return "this node's GPUs lack peer access to each other (torch.cuda.can_device_access_peer)"
    if f.symm_missing:
        return f"this torch build lacks symmetric memory: {f.symm_missing}"
    return None


def decide(requested: str, f: Facts) -> tuple[str, str]:
    """The group's path ("none" | the backend: "nccl" or "gloo" | "symm_one_shot" | "symm_two_shot") and
    why; raises AllReduceError for an explicit symm_* value that cannot run."""
    if requested not in CHOICES:
        raise AllReduceError(f"'parallel.allreduce' must be one of {list(CHOICES)}, got {requested!r}")
    if f.world == 1:
        return "none", "tp = 1: nothing to reduce"
    if requested == "nccl":
        return f.backend, f"parallel.allreduce=nccl: the group's backend, {f.backend}"
    blocker = symm_blocker(f)
    if blocker is None:
        path = "symm_one_shot" if requested == "auto" else requested
        return path, f"parallel.allreduce={requested}: {path} on {f.world} GPUs of one node"
    if requested == "auto":
        return f.backend, f"parallel.allreduce=auto: {f.backend}, since {blocker}"
    raise AllReduceError(f"'parallel.allreduce'={requested} cannot run here: {blocker}; "
                         "use parallel.allreduce=auto (falls back to NCCL) or nccl")


def route(path: str, threshold_bytes: int, nbytes: int, dtype: torch.dtype, dense: bool = True) -> str:
    """The path one message takes: the group's symm path when the kernels take it (dense: contiguous and
    starting on a 16-byte boundary, as their vector loads and stores need) and it is small enough, else the
    group's backend (NCCL: a symm path exists only on NCCL groups)."""
    if path not in SYMM_PATHS:
        return path
    fits = 0 < nbytes <= threshold_bytes and nbytes % ALIGN_BYTES == 0
    return path if fits and dtype in SYMM_DTYPES and dense else "nccl"


def choose(requested: str, *, backend: str, world: int, nodes: int | None, peer_access: bool,
           symm_missing: str | None, threshold_bytes: int, nbytes: int,
           dtype: torch.dtype = torch.bfloat16) -> tuple[str, str]:
    """The whole decision as a pure function: (the path a message of nbytes takes, the group's reason)."""
    path, reason = decide(requested, Facts(backend, world, nodes, peer_access, symm_missing))
    return route(path, threshold_bytes, nbytes, dtype), reason


# ---------------------------------------------------------------- the strategy a group carries


@dataclass(eq=False)  # compared and hashed by identity: TPGroup values that carry it stay hashable
class AllReduce:
    """The chosen all-reduce of one group: its path, the symmetric buffer (symm paths), the threshold."""

    requested: str
    path: str  # "none" | "nccl" | "gloo" | "symm_one_shot" | "symm_two_shot"
    reason: str
    group: dist.ProcessGroup | None = None
    buffer: torch.Tensor | None = None  # uint8 [buffer_bytes], symmetric over the group
    threshold_bytes: int = 0  # messages up to this take `path` (a symm path); larger ones NCCL
    world: int = 1
    drain_s: float = DRAIN_LIMIT_S  # teardown waits at most this long for the device (group.shutdown)
    probe_us: dict = field(default_factory=dict)  # bytes -> {"nccl": us, "symm": us} (auto, rank 0's)

    @property
    def uses_symm(self) -> bool:
        return self.buffer is not None

    def route(self, x: torch.Tensor) -> str:
        dense = x.is_contiguous() and x.storage_offset() * x.element_size() % ALIGN_BYTES == 0
        return route(self.path, self.threshold_bytes, x.numel() * x.element_size(), x.dtype, dense)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """In-place sum of x over the group."""
        p = self.route(x)
        if p in SYMM_PATHS:
            flat = x.view(-1)
            buf = self.buffer[: flat.numel() * flat.element_size()].view(x.dtype)
            (_one_shot if p == "symm_one_shot" else _two_shot)(buf, flat, self.group.group_name, self.world)
        elif p != "none":
            dist.all_reduce(x, group=self.group)
        return x

    def label(self) -> str:
        if self.path in SYMM_PATHS and self.threshold_bytes == 0:
            return "nccl (symm_one_shot lost at every probed size)"
        if self.path in SYMM_PATHS:
            return f"{self.path} up to {self.threshold_bytes} bytes, nccl above"
        return self.path

    def describe(self) -> dict:
        """The report's fields: the chosen all-reduce and why."""
        return {"allreduce": self.label(), "allreduce_path": self.path, "allreduce_requested": self.requested,
                "allreduce_reason": self.reason, "allreduce_threshold_bytes": self.threshold_bytes,
                "allreduce_buffer_bytes": 0 if self.buffer is None else self.buffer.numel(),
                "allreduce_probe_us": {str(k): v for k, v in self.probe_us.items()}}


def _one_shot(buf: torch.Tensor, flat: torch.Tensor, group_name: str, world: int) -> None:
    ops = torch.ops.symm_mem
    if hasattr(ops, "one_shot_all_reduce_copy_out"):  # the copy into the buffer fused into the kernel
        # out aliases local_input: each thread reads element i before it writes element i (same grid stride).
        ops.one_shot_all_reduce_copy_out(buf, flat, "sum", group_name, flat)
    else:
        buf.copy_(flat)
        ops.one_shot_all_reduce_out(buf, "sum", group_name, flat)


def _two_shot(buf: torch.Tensor, flat: torch.Tensor, group_name: str, world: int) -> None:
    ops = torch.ops.symm_mem
    buf.copy_(flat)
    if world in (2, 4, 8) and hasattr(ops, "two_shot_all_reduce_out"):  # the out variant's world sizes
        ops.two_shot_all_reduce_out(buf, "sum", group_name, flat)
    else:
        ops.two_shot_all_reduce_(buf, "sum", group_name)
        flat.copy_(buf)


# ---------------------------------------------------------------- set-up (once, before any capture)


def symm_missing_here(device: torch.device) -> str | None:
    """Why this process cannot use torch's symmetric memory on `device`, or None."""
    if device.type != "cuda":
        return f"the rank runs on {device.type}"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch.distributed._symmetric_memory does not import ({e})"
    ops = getattr(torch.ops, "symm_mem", None)
    missing = [n for n in ("one_shot_all_reduce_out", "two_shot_all_reduce_") if not hasattr(ops, n)]
    missing += [n for n in ("empty", "rendezvous") if not hasattr(symm_mem, n)]
    return f"missing {', '.join(missing)}" if missing else None


def peer_access_here(device: torch.device, local_size: int | None) -> bool:
    """This rank's GPU reaches every other GPU its node's ranks use (they pick GPU = local rank)."""
    if device.type != "cuda" or not local_size or torch.cuda.device_count() < local_size:
        return False  # masked devices (CUDA_VISIBLE_DEVICES per rank): peers cannot be checked
    return all(torch.cuda.can_device_access_peer(device.index, d) for d in range(local_size) if d != device.index)


def gather_facts(tp) -> Facts:
    """Every rank's view combined over the cpu group, so every rank decides from the same facts."""
    backend = dist.get_backend(tp.group) if tp.size > 1 else "none"
    mine = {"peer": peer_access_here(tp.device, tp.local_size), "symm": symm_missing_here(tp.device)}
    views = [mine]
    if tp.size > 1:
        views = [None] * tp.size
        dist.all_gather_object(views, mine, group=tp.cpu_group)
    missing = next((f"rank {r}: {v['symm']}" for r, v in enumerate(views) if v["symm"]), None)
    nodes = tp.size // tp.local_size if tp.local_size and tp.size % tp.local_size == 0 else None
    return Facts(str(backend), tp.size, nodes, all(v["peer"] for v in views), missing)


def setup_allreduce(tp, requested: str, max_bytes: int, dtype: torch.dtype, timeout_s: float = 60.0):
    """tp with its all-reduce chosen (a new TPGroup value): facts gathered, path decided, the symmetric
    buffer allocated and rendezvoused, auto's threshold measured; logged once on rank 0. Collective: every
    rank calls it at the same point, before any graph capture."""
    import dataclasses

    path, reason = decide(requested, gather_facts(tp))
    ar = AllReduce(requested, path, reason, group=tp.group, world=tp.size,
                   drain_s=min(timeout_s, DRAIN_LIMIT_S))
    if path in SYMM_PATHS:
        nbytes = max(ALIGN_BYTES, min(MAX_SYMM_BYTES, max_bytes) // ALIGN_BYTES * ALIGN_BYTES)
        ar.buffer = _symm_buffer(nbytes, tp)
        ar.threshold_bytes = nbytes
        if requested == "auto":
            _measure_threshold(ar, tp, dtype)
    if tp.rank == 0 and tp.size > 1:  # tp = 1 has no all-reduce to speak of (its report still says so)
        print(f"tp_runtime: all-reduce: {ar.label()} ({ar.reason})", file=sys.stderr, flush=True)
    return dataclasses.replace(tp, allreduce=ar)


def _symm_buffer(nbytes: int, tp) -> torch.Tensor:
    """A uint8 buffer in symmetric memory, rendezvoused over the device group (collective)."""
    import os

    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # NVLink multicast stays off here
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None and getattr(enable, "__deprecated__", None) is None:
        # Older torch needs the group registered first; where the call is deprecated (2.11 and 2.13 here)
        # rendezvous resolves the group by name, so it is skipped.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(tp.group.group_name)
    buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=tp.device)
    symm_mem.rendezvous(buf, tp.group.group_name)
    return buf


def _measure_threshold(ar: AllReduce, tp, dtype: torch.dtype) -> None:
    """auto: time NCCL and the symm path inside CUDA graphs at PROBE_BYTES up to the buffer; the threshold is
    the largest size up to which the symm path won at every probed size (0: NCCL for all). Rank 0's
    threshold is broadcast over the cpu group: ranks never route a message differently."""
    dtype = dtype if dtype in SYMM_DTYPES else torch.bfloat16
    cap = ar.buffer.numel()
    sizes = [s for s in PROBE_BYTES if s <= cap] or [cap]
    times = {}
    for s in sizes:  # every size on every rank: the probes are collectives, so no rank may stop early
        x = torch.zeros(s // dtype.itemsize, dtype=dtype, device=tp.device)  # zeros: repeated sums stay finite
        times[s] = {"nccl": _graph_us(lambda x=x: dist.all_reduce(x, group=ar.group), tp.device),
                    "symm": _graph_us(lambda x=x: ar(x), tp.device)}
    threshold = threshold_from(times, cap)
    agreed = torch.tensor([threshold], dtype=torch.long)
    dist.broadcast(agreed, src=0, group=tp.cpu_group)
    ar.threshold_bytes, ar.probe_us = int(agreed), times
    ar.reason += f"; one-shot below {ar.threshold_bytes} bytes (measured at start-up in CUDA graphs, rank 0's)"


def threshold_from(times: dict[int, dict[str, float]], cap: int) -> int:
    """The largest probed size up to which the symm path beat NCCL at every probed size (the buffer size
    when it won at all of them; 0 when it lost at the smallest)."""
    threshold, sizes = 0, sorted(times)
    for s in sizes:
        if times[s]["symm"] >= times[s]["nccl"]:
            return threshold
        threshold = cap if s == sizes[-1] else s
    return threshold


def _graph_us(fn, device: torch.device) -> float:
    """Median microseconds of one call of fn, PROBE_CALLS calls captured back to back in one CUDA graph."""
    return graph_timing(fn, device, calls=PROBE_CALLS, replays=PROBE_REPLAYS).median_ms * 1e3
