"""StepGraphs: one CUDA graph of the whole step per capture size (largest first), all sizes in one pool.

Two kinds, one interface (capture, size_for, replay, close):
  full       one plain torch.cuda.CUDAGraph of every layer's stages A, B and C: the decode path whose
             sizes all come from the config, so the graph replays on any decode-only step
  breakable  one BreakableGraph (segments + eager calls, `tp_runtime.graphs`) per size: any step

The Worker captures and replays them; full and breakable graphs of one Worker share one memory pool. Full
graphs take graph.capture_sizes (decode sizes); breakable ones those and graph.breakable_capture_sizes.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from tp_runtime.graphs import BreakableGraph, free_graphs


class StepGraphs:
    """Graphs of the whole forward per capture size (largest first), sharing one pool.

    `forward(size)` must run the step on static buffers padded to `size` tokens and return a static
    output. Each size gets one eager run before the captures (lazy initialisation stays out of them).
    """

    def __init__(self, sizes: list[int], device: torch.device, full: bool, pool: Any = None):
        self.sizes = sorted(set(sizes), reverse=True)
        self.device, self.full = device, full
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph | BreakableGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.capture_s = 0.0
        # Growth of the device's reserved memory over capture(): after it (the pool, with the eager breaks'
        # cached blocks), at the warm-ups' peak (released before the captures) and at the peak of both.
        self.pool_bytes = self.warmup_bytes = self.peak_bytes = 0

    @property
    def kind(self) -> str:
        return "full" if self.full else "breakable"

    def capture(self, forward: Callable[[int], torch.Tensor], barrier: Callable[[], None] | None = None) -> None:
        """Eager warm-up of every size, largest first; their memory back to the device; `barrier` (every rank warm:
        see Worker); then every capture, largest first, into the pool.

        The warm-ups run on the caching allocator, outside the pool: a graph's pool cannot reuse their blocks, so
        warming a size up just before capturing it would hold one step's activations twice (the warm-up's cached
        blocks beside the pool; at 2048 tokens of a prefill size, a second workspace). Warming every size first
        (each smaller one reuses the largest's blocks) and emptying the cache before the first capture keeps the
        peak at the larger of the two, which is what memory_model.py's workspace estimate counts.
        """
        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # earlier free blocks would blur what this capture adds
        reserved0 = torch.cuda.memory_reserved(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for size in self.sizes:
                forward(size)  # eager warm-up of this shape: lazy initialisation and Triton JIT stay out of capture
            torch.cuda.synchronize(dev)
            self.warmup_bytes = torch.cuda.max_memory_reserved(dev) - reserved0
            torch.cuda.empty_cache()
            if barrier is not None:
                barrier()
            for size in self.sizes:
                self.outputs[size], self.graphs[size] = self._capture_one(forward, size, stream)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        self.pool_bytes = torch.cuda.memory_reserved(dev) - reserved0
        self.peak_bytes = torch.cuda.max_memory_reserved(dev) - reserved0

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
                "eager_breaks_per_step": self.breaks_per_step, "graph_pool_bytes": self.pool_bytes,
                "warmup_bytes": self.warmup_bytes, "capture_peak_bytes": self.peak_bytes}

    def close(self) -> None:
        self.outputs.clear()
        free_graphs(self.graphs)
