"""Worker: one rank's lifecycle, read top to bottom in the constructor, and its `step`.

    join the TP group -> choose its all-reduce (parallel/allreduce.py: NCCL or symmetric memory, the buffer
    rendezvoused once) -> build the model shard (stack slice, weights, caches, static buffers; shard.py)
    -> warm the all-reduce eagerly on every rank, barrier -> capture graphs (GPU): full graphs of the decode step
    and / or breakable graphs

How a step runs (`graph.mode`), decided from the plan alone, so every rank takes the same path:

    decode-only step of mode full / full_and_breakable   the static decode path (every size from the
                                                         config): the full graph of the smallest capture
                                                         size holding it, else (CPU, too many tokens)
                                                         the same path eagerly, or for
                                                         full_and_breakable as any other step
    any other step                                       the breakable graph of the smallest capture
                                                         size holding it (breakable, full_and_breakable;
                                                         graph.capture_sizes and breakable_capture_sizes),
                                                         else eagerly

Every command builds its Workers through `engine/session.py` (RankSession).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from typing import NamedTuple

import torch

from tp_runtime.config import RunConfig, breakable_sizes
from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.shard import ModelShard, resolve_dtype
from tp_runtime.executor.step_graphs import StepGraphs
from tp_runtime.memory_model import buffer_capacity
from tp_runtime.parallel.allreduce import setup_allreduce
from tp_runtime.parallel.group import TPGroup, shutdown, warm_up_collectives

FULL_MODES = ("full", "full_and_breakable")  # decode-only steps take the static (full-graph) path
BREAKABLE_MODES = ("breakable", "full_and_breakable")


class StepRun(NamedTuple):
    """How one step ran."""

    path: str  # "full" (the static decode path), "breakable" or "eager"
    size: int | None  # the capture size replayed; None when the step ran eagerly


class Worker:
    def __init__(self, cfg: RunConfig, tp: TPGroup, oneshot: bool = False, shard: ModelShard | None = None):
        """Build a shard (or run on `shard`, built for the same model and runtime), then capture graphs."""
        if shard is None:
            tp = with_allreduce(cfg, tp, oneshot)
            shard = ModelShard.build(cfg, tp, oneshot)  # its layers reduce through tp's strategy
        else:
            shard.check_serves(cfg, tp, oneshot)
            tp = _shard_group(cfg, shard)
        self.cfg, self.tp, self.device, self.shard = cfg, tp, tp.device, shard
        self.break_scope = cfg.graph.break_scope
        self.static_decode = cfg.graph.mode in FULL_MODES
        self.dtype, self.stack, self.caches = shard.dtype, shard.stack, shard.caches
        self.buffers, self.attn_out, self.live, self.load_report = (shard.buffers, shard.attn_out, shard.live,
                                                                    shard.load_report)
        warm_up_collectives(tp)
        self.full_graphs: StepGraphs | None = None
        self.breakable_graphs: StepGraphs | None = None
        if self._graphs_wanted():
            self._capture_graphs()

    # ------------------------------------------------------------ lifecycle

    def _graphs_wanted(self) -> bool:
        mode = self.cfg.graph.mode
        if mode == "eager":
            return False
        if self.device.type != "cuda":
            if self.tp.rank == 0:  # once per run, not once per rank
                warnings.warn(f"graph.mode={mode} needs a CUDA device; this run is on CPU and runs eagerly "
                              "(the same code paths, without capture)", stacklevel=2)
            return False
        return True

    def _capture_graphs(self) -> None:
        """Full graphs first (largest size first), then breakable ones, all in one memory pool. Full graphs take
        graph.capture_sizes (decode sizes); breakable ones those and graph.breakable_capture_sizes (config.py)."""
        mode, cap = self.cfg.graph.mode, self.buffers.capacity
        full_sizes = [s for s in self.cfg.graph.capture_sizes if s <= cap]
        pool = torch.cuda.graph_pool_handle()
        # Capture on an all-padding step (trash slot, position 0, zero inputs): no real cache row is
        # touched, and every length a kernel reads is valid. The buffers are filled here, outside the
        # capture: a copy captured into a graph would rerun at every replay and overwrite the live inputs.
        no_rows = torch.zeros(0, self.cfg.model.hidden_size, dtype=self.dtype, device=self.device)
        self.buffers.load(StepPlan(()), no_rows, self.buffers.capacity)
        # Every rank ends each size's eager warm-up (Triton JIT included) before any rank captures it: ranks
        # that diverge there deadlock a symmetric-memory all-reduce.
        barrier = self._barrier if self.tp.has_peers else None
        with torch.no_grad():
            if mode in FULL_MODES:
                self.full_graphs = StepGraphs(full_sizes, self.device, full=True, pool=pool)
                self.full_graphs.capture(self._forward_full, barrier)
            if mode in BREAKABLE_MODES:
                sizes = [s for s in breakable_sizes(self.cfg) if s <= cap]
                self.breakable_graphs = StepGraphs(sizes, self.device, full=False, pool=pool)
                scope = self.break_scope
                self.breakable_graphs.capture(lambda size: self._forward(self.buffers.view(size, 0, 0), scope),
                                              barrier)

    def _barrier(self) -> None:
        torch.distributed.barrier(group=self.tp.cpu_group)

    @property
    def allreduce_report(self) -> dict:
        """The chosen all-reduce and why (the run report's and bench records' fields)."""
        return self.tp.allreduce.describe() if self.tp.allreduce is not None else {}

    @property
    def graph_sets(self) -> list[StepGraphs]:
        return [g for g in (self.full_graphs, self.breakable_graphs) if g is not None]

    def release_graphs(self) -> None:
        """Drop every captured graph (before the process group goes, and when a bench frees a Worker)."""
        for g in self.graph_sets:
            g.close()
        self.full_graphs = self.breakable_graphs = None

    def close(self) -> None:
        """Free graphs, then leave the process group (the reverse order hangs NCCL)."""
        shutdown(self.tp, self.release_graphs if self.graph_sets else None)

    # ------------------------------------------------------------ one step

    def _forward(self, batch, break_scope: str | None) -> torch.Tensor:
        self.live.batch = batch
        return self.stack(batch.x, self.live, self.caches, self.attn_out, break_scope)

    def _forward_full(self, size: int) -> torch.Tensor:
        """The static decode step a full graph holds: the step index from the metadata buffers, then every
        layer, without a break, on a batch whose sizes come from the config alone."""
        self.buffers.compute_index(size)
        return self._forward(self.buffers.view(size, size, self.cfg.runtime.max_len - 1, decode=True), None)

    @torch.no_grad()
    def step(self, plan: StepPlan, x: torch.Tensor, on_break=None, replay: bool = True) -> tuple[torch.Tensor, StepRun]:
        """Run one step; returns final hidden states [n_tokens, hidden] and how it ran.

        The path depends only on the plan, which every rank received from the driver, so all ranks take
        the same one. A decode-only step of a full mode replays its full graph; where none holds it (CPU,
        or more tokens than the largest capture size) it runs the same static path eagerly, unless the
        mode has breakable graphs to fall back on. replay=False runs the chosen path's code eagerly at the
        same padded size (the bench's profile view: kernels attributed to the code that launched them).
        """
        n = plan.n_tokens
        if self.static_decode and plan.decode_only:
            size = self.full_graphs.size_for(n) if self.full_graphs is not None else None
            if size is not None:
                self.buffers.load(plan, x, size, index=False)
                out = self.full_graphs.replay(size) if replay else self._forward_full(size)
                return out[:n], StepRun("full", size if replay else None)
            if self.breakable_graphs is None:
                self.buffers.load(plan, x, n, index=False)
                return self._forward_full(n)[:n], StepRun("full", None)
        g = self.breakable_graphs
        size = g.size_for(n) if g is not None else None
        if size is None or not replay:
            return self._forward(self.buffers.load(plan, x, n), self.break_scope)[:n], StepRun("eager", None)
        self.live.batch = self.buffers.load(plan, x, size)
        return g.replay(size, on_break)[:n], StepRun("breakable", size)


def with_allreduce(cfg: RunConfig, tp: TPGroup, oneshot: bool) -> TPGroup:
    """tp carrying its all-reduce (parallel.allreduce), its buffer sized for the largest message a step of
    this config issues: buffer rows x hidden x the run dtype. A group that has one already keeps it."""
    if tp.allreduce is not None:
        return tp
    dtype = resolve_dtype(cfg.runtime.dtype, tp.device)
    max_bytes = buffer_capacity(cfg, oneshot) * cfg.model.hidden_size * dtype.itemsize
    return setup_allreduce(tp, cfg.parallel.allreduce, max_bytes, dtype, cfg.parallel.timeout_s)


def _shard_group(cfg: RunConfig, shard: ModelShard) -> TPGroup:
    """The group a shared shard's layers reduce through; its all-reduce must be the one cfg asks for."""
    ar = shard.tp.allreduce
    if ar is not None and shard.tp.size > 1 and ar.requested != cfg.parallel.allreduce:
        raise ValueError(f"{cfg.source}: parallel.allreduce={cfg.parallel.allreduce}, but the shared shard "
                         f"reduces with parallel.allreduce={ar.requested}; such Workers need their own shard")
    return shard.tp


class FaultyWorker(Worker):
    """Testing only (parallel.fail_rank / fail_step / fail_mode): as step `fail_step` begins, this rank
    SIGKILLs its own process (kill: no exception, no cleanup, its sockets closed by the kernel, like a
    crash) or SIGSTOPs it (stop: a hung rank, alive with its sockets open, answering nothing)."""

    steps_begun = 0

    def step(self, plan: StepPlan, x: torch.Tensor, on_break=None, replay: bool = True) -> tuple[torch.Tensor, StepRun]:
        if self.steps_begun == self.cfg.parallel.fail_step:
            mode = self.cfg.parallel.fail_mode
            print(f"tp_runtime: rank {self.tp.rank} {mode}s itself at step {self.steps_begun} (time {time.time():.3f})",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
        self.steps_begun += 1
        return super().step(plan, x, on_break, replay)
