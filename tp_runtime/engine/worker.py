"""Worker: one rank's lifecycle, read top to bottom in the constructor, and its `step`.

    join the TP group -> build the model shard (stack slice, weights, caches, static buffers; shard.py)
    -> warm NCCL eagerly -> capture breakable graphs (GPU, graph.mode=breakable)

Every launcher runs it through `entry.worker_entry`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings

import torch

from tp_runtime.config import RunConfig
from tp_runtime.engine.plan import StepPlan
from tp_runtime.engine.shard import ModelShard
from tp_runtime.engine.step_graphs import StepGraphs
from tp_runtime.parallel.group import TPGroup, shutdown, warm_up_collectives


class Worker:
    def __init__(self, cfg: RunConfig, tp: TPGroup, oneshot: bool = False, shard: ModelShard | None = None):
        """Build a shard (or run on `shard`, built for the same model and runtime), then capture graphs."""
        if shard is None:
            shard = ModelShard.build(cfg, tp, oneshot)
        else:
            shard.check_serves(cfg, tp, oneshot)
        self.cfg, self.tp, self.device, self.shard = cfg, tp, tp.device, shard
        self.break_scope = cfg.graph.break_scope
        self.dtype, self.stack, self.caches = shard.dtype, shard.stack, shard.caches
        self.buffers, self.attn_out, self.live, self.load_report = (shard.buffers, shard.attn_out, shard.live,
                                                                    shard.load_report)
        warm_up_collectives(tp)
        self.graphs = self._capture_graphs() if self._graphs_wanted() else None

    # ------------------------------------------------------------ lifecycle

    def _graphs_wanted(self) -> bool:
        if self.cfg.graph.mode != "breakable":
            return False
        if self.device.type != "cuda":
            warnings.warn("graph.mode=breakable needs a CUDA device; this run is on CPU and runs eagerly "
                          "(the same code path, without capture)", stacklevel=2)
            return False
        return True

    def _capture_graphs(self) -> StepGraphs:
        graphs = StepGraphs([s for s in self.cfg.graph.capture_sizes if s <= self.buffers.capacity], self.device)
        # Capture on an all-padding step (trash slot, zero inputs): no real cache row is touched.
        # The buffers are filled here, outside the capture: a copy captured into a segment would
        # rerun at every replay and overwrite the live step's inputs.
        no_rows = torch.zeros(0, self.cfg.model.hidden_size, dtype=self.dtype, device=self.device)
        self.buffers.load(StepPlan(()), no_rows, self.buffers.capacity)
        with torch.no_grad():
            graphs.capture(lambda size: self._forward(self.buffers.view(size, 0, 0)))
        return graphs

    def close(self) -> None:
        """Free graphs, then leave the process group (the reverse order hangs NCCL)."""
        release = self.graphs.close if self.graphs is not None else None
        self.graphs = None
        shutdown(self.tp, release)

    # ------------------------------------------------------------ one step

    def _forward(self, batch) -> torch.Tensor:
        self.live.batch = batch
        return self.stack(batch.x, self.live, self.caches, self.attn_out, self.break_scope)

    @torch.no_grad()
    def step(self, plan: StepPlan, x: torch.Tensor, on_break=None) -> tuple[torch.Tensor, int | None]:
        """Run one step; returns final hidden states [n_tokens, hidden] and the replayed capture size
        (None when the step ran eagerly).

        The replay-or-eager decision depends only on the plan, which every rank received from the
        driver, so all ranks take the same one.
        """
        n = plan.n_tokens
        size = self.graphs.size_for(n) if self.graphs is not None else None
        if size is None:
            return self._forward(self.buffers.load(plan, x, n))[:n], None
        self.live.batch = self.buffers.load(plan, x, size)
        return self.graphs.replay(size, on_break)[:n], size


class FaultyWorker(Worker):
    """Testing only (parallel.fail_rank / fail_step / fail_mode): as step `fail_step` begins, this rank
    SIGKILLs its own process (kill: no exception, no cleanup, its sockets closed by the kernel, like a
    crash) or SIGSTOPs it (stop: a hung rank, alive with its sockets open, answering nothing)."""

    steps_begun = 0

    def step(self, plan: StepPlan, x: torch.Tensor, on_break=None) -> tuple[torch.Tensor, int | None]:
        if self.steps_begun == self.cfg.parallel.fail_step:
            mode = self.cfg.parallel.fail_mode
            print(f"tp_runtime: rank {self.tp.rank} {mode}s itself at step {self.steps_begun} (time {time.time():.3f})",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
        self.steps_begun += 1
        return super().step(plan, x, on_break)
