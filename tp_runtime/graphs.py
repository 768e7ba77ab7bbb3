"""Breakable CUDA graphs: a forward captured as graph segments with eager calls between them.

A function decorated `@eager_break_during_capture` is a plain call outside capture. Inside
`BreakableGraph.capture` it ends the segment being captured, runs eagerly on the capture stream
(recorded with its arguments), and a new segment begins after it. `replay` runs segments and eager
calls in order; an eager call reads live host state (e.g. `LiveBatch.batch`) when it runs.

Rules kept here: an eager call returns nothing to the graph (it writes into caller-provided buffers);
its tensor arguments are held as non-owning aliases, so they do not pin graph-pool memory; a
decorated call nested in another runs inline; capture state is per thread and reset on exceptions.
"""

from __future__ import annotations

import functools
import gc
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

_tls = threading.local()


def _active() -> "BreakableGraph | None":
    return getattr(_tls, "capture", None)


def eager_break_during_capture(fn: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        cap = _active()
        if cap is None or cap.in_break:
            result = fn(*args, **kwargs)
        else:
            result = cap.record_break(fn, args, kwargs)
        if result is not None:
            raise TypeError(f"{fn.__name__} is an eager break and must write into its output buffer, "
                            f"not return {type(result).__name__}")
    return wrapper


# ------------------------------------------------------------------ non-owning tensor aliases


@dataclass(frozen=True)
class _TensorRef:
    """Enough to rebuild a view of memory without owning it (the graph pool keeps the memory)."""

    ptr: int
    nbytes: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> "_TensorRef":
        st = t.untyped_storage()
        return cls(st.data_ptr(), st.nbytes(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                   t.dtype, t.device)

    def materialize(self) -> torch.Tensor:
        storage = torch._C._construct_storage_from_data_pointer(self.ptr, self.device, self.nbytes)
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(storage, self.offset, self.size,
                                                                          self.stride)


def _pack(x: Any) -> Any:
    """Replace CUDA tensors (also inside tuples, lists, dicts, named tuples) by non-owning refs."""
    if isinstance(x, torch.Tensor):
        return _TensorRef.of(x) if x.is_cuda else x
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_pack(v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_pack(v) for v in x)
    if isinstance(x, dict):
        return {k: _pack(v) for k, v in x.items()}
    return x


def _unpack(x: Any) -> Any:
    if isinstance(x, _TensorRef):
        return x.materialize()
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_unpack(v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_unpack(v) for v in x)
    if isinstance(x, dict):
        return {k: _unpack(v) for k, v in x.items()}
    return x


@dataclass
class _EagerCall:
    fn: Callable[..., None]
    args: tuple
    kwargs: dict
    _live: tuple | None = None  # materialized aliases, built on the first replay and reused

    def __call__(self) -> None:
        if self._live is None:
            self._live = (_unpack(self.args), _unpack(self.kwargs))
        self.fn(*self._live[0], **self._live[1])


# ------------------------------------------------------------------ one breakable graph


@dataclass
class BreakableGraph:
    """Segments (CUDA graphs) and eager calls of one captured forward, replayed in order."""

    pool: Any  # torch.cuda graph pool handle shared by every capture of a runner
    items: list = field(default_factory=list)  # torch.cuda.CUDAGraph | _EagerCall, in order
    in_break: bool = False
    _open: torch.cuda.CUDAGraph | None = None

    @property
    def n_segments(self) -> int:
        return sum(isinstance(i, torch.cuda.CUDAGraph) for i in self.items)

    @property
    def n_breaks(self) -> int:
        return sum(isinstance(i, _EagerCall) for i in self.items)

    def capture(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Capture fn(*args) on the current (non-default) stream; returns its output tensors."""
        if _active() is not None:
            raise RuntimeError("a breakable capture is already in progress on this thread")
        _tls.capture = self
        try:
            self._begin()
            out = fn(*args)
            self._end()
            return out
        except BaseException:
            if self._open is not None:
                try:
                    self._open.capture_end()
                except RuntimeError:
                    pass  # the capture was already invalidated; the original error matters
                self._open = None
            self.items.clear()
            raise
        finally:
            _tls.capture = None

    def record_break(self, fn: Callable[..., None], args: tuple, kwargs: dict) -> None:
        self._end()
        call = _EagerCall(fn, _pack(args), _pack(kwargs))
        self.items.append(call)
        self.in_break = True
        try:
            fn(*args, **kwargs)  # runs for real on the capture stream, outside any graph
        finally:
            self.in_break = False
        self._begin()

    def replay(self, on_break: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Run every segment and eager call in order; on_break(call) may wrap eager calls (timing)."""
        for item in self.items:
            if isinstance(item, _EagerCall):
                item() if on_break is None else on_break(item)
            else:
                item.replay()

    def _begin(self) -> None:
        self._open = torch.cuda.CUDAGraph()
        self._open.capture_begin(pool=self.pool)

    def _end(self) -> None:
        g, self._open = self._open, None
        g.capture_end()
        self.items.append(g)


def free_graphs(graphs: dict) -> None:
    """Drop captured graphs and collect them; must precede destroying the process group."""
    graphs.clear()
    gc.collect()
