"""StepGraphs: one CUDA graph of the whole step per capture size (largest first), all sizes in one pool.

Two kinds, one interface (capture, size_for, replay, close):
  full       one plain torch.cuda.CUDAGraph of every layer's stages A, B and C: the decode path whose
             sizes all come from the config, so the graph replays on any decode-only step
  breakable  one BreakableGraph (segments + eager calls, `tp_runtime.graphs`) per size: any step

The Worker captures and replays them; full and breakable graphs of one Worker share one memory pool.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from tp_runtime.graphs import BreakableGraph, free_graphs


class StepGraphs:
    """Graphs of the whole forward per capture size (largest first), sharing one pool.

    `forward(size)` must run the step on static buffers padded to `size` tokens and return a static
    output. Each size gets one eager run before its capture (lazy initialisation stays out of it).
    """

    def __init__(self, sizes: list[int], device: torch.device, full: bool, pool: Any = None):
        self.sizes = sorted(set(sizes), reverse=True)
        self.device, self.full = device, full
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph | BreakableGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool_bytes = 0
        self.capture_s = 0.0

    @property
    def kind(self) -> str:
        return "full" if self.full else "breakable"

    def capture(self, forward: Callable[[int], torch.Tensor], barrier: Callable[[], None] | None = None) -> None:
        """Per size: eager warm-up, synchronize, `barrier` (every rank warm: see Worker), capture."""
        torch.cuda.synchronize(self.device)
        reserved0 = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in self.sizes:
                forward(size)  # eager warm-up of this shape
                torch.cuda.synchronize(self.device)
                if barrier is not None:
                    barrier()
                self.outputs[size], self.graphs[size] = self._capture_one(forward, size, stream)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - reserved0

    def _capture_one(self, forward: Callable[[int], torch.Tensor], size: int, stream: torch.cuda.Stream):
        if not self.full:
            g = BreakableGraph(self.pool)
            return g.capture(forward, size), g
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=stream):
            out = forward(size)
        return out, g

    def size_for(self, n_tokens: int) -> int | None:
        """Smallest capture size holding n_tokens, or None (the step runs another way)."""
        fits = [s for s in self.sizes if s >= n_tokens]
        return min(fits) if fits else None

    def replay(self, size: int, on_break: Callable[[Callable[[], None]], None] | None = None) -> torch.Tensor:
        g = self.graphs[size]
        g.replay() if self.full else g.replay(on_break)
        return self.outputs[size]

    @property
    def segments_per_step(self) -> int:
        if self.full:
            return 1 if self.graphs else 0
        return next(iter(self.graphs.values())).n_segments if self.graphs else 0

    @property
    def breaks_per_step(self) -> int:
        if self.full:
            return 0
        return next(iter(self.graphs.values())).n_breaks if self.graphs else 0

    def stats(self) -> dict:
        return {"capture_sizes": self.sizes, "capture_s": self.capture_s, "segments_per_step": self.segments_per_step,
                "eager_breaks_per_step": self.breaks_per_step, "graph_pool_bytes": self.pool_bytes}

    def close(self) -> None:
        self.outputs.clear()
        free_graphs(self.graphs)
