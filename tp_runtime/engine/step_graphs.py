"""StepGraphs: one breakable graph of the whole step per capture size (largest first), one memory pool.

Built on the capture primitive of `tp_runtime.graphs`; the Worker captures and replays them.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from tp_runtime.graphs import BreakableGraph, free_graphs


class StepGraphs:
    """One breakable graph of the whole forward per capture size (largest first), sharing one pool.

    `forward(size)` must run the step on static buffers padded to `size` tokens and return a static
    output. Each size gets one eager run before its capture (lazy initialisation stays out of it).
    """

    def __init__(self, sizes: list[int], device: torch.device):
        self.sizes = sorted(set(sizes), reverse=True)
        self.device = device
        self.graphs: dict[int, BreakableGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool_bytes = 0
        self.capture_s = 0.0

    def capture(self, forward: Callable[[int], torch.Tensor]) -> None:
        torch.cuda.synchronize(self.device)
        reserved0 = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in self.sizes:
                forward(size)  # eager warm-up of this shape
                torch.cuda.synchronize(self.device)
                g = BreakableGraph(pool)
                self.outputs[size] = g.capture(forward, size)
                self.graphs[size] = g
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - reserved0

    def size_for(self, n_tokens: int) -> int | None:
        """Smallest capture size holding n_tokens, or None (the step runs eagerly)."""
        fits = [s for s in self.sizes if s >= n_tokens]
        return min(fits) if fits else None

    def replay(self, size: int, on_break: Callable[[Callable[[], None]], None] | None = None) -> torch.Tensor:
        self.graphs[size].replay(on_break)
        return self.outputs[size]

    @property
    def segments_per_step(self) -> int:
        return next(iter(self.graphs.values())).n_segments if self.graphs else 0

    @property
    def breaks_per_step(self) -> int:
        return next(iter(self.graphs.values())).n_breaks if self.graphs else 0

    def close(self) -> None:
        self.outputs.clear()
        free_graphs(self.graphs)
