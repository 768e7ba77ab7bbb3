"""Host-to-device copies the host never waits on: a small ring of pinned host buffers, each reused only
once the copy last made from it has left it.

A copy from pageable memory (`tensor.to("cuda")`) blocks the host until the GPU has run everything queued
before it, so a step loop that makes its inputs that way can never run ahead of the GPU. A copy from
pinned memory with `non_blocking=True` is queued like a kernel; its source must then stay untouched until
the GPU has executed it. `HostRing` keeps `depth` buffers and, per buffer, an event recorded after its
last copy; taking a buffer waits on that event. With depth 3 the wait ends at once unless the host is
three copies ahead of the GPU, and then the GPU still has that work queued.

    ring = HostRing.for_device(device)        # None on a CPU: copies there are plain copies
    buf = ring.take((5, n), torch.long)       # waits for the copy made from this buffer 3 takes ago
    buf.copy_(host_rows)                      # or fill it in place (torch.cat(..., out=buf))
    ring.send(buf, device_tensor)             # device_tensor.copy_(buf, non_blocking=True); event recorded
"""

from __future__ import annotations

import math
import time
from typing import Callable, Protocol

import torch

DEPTH = 3  # buffers per ring: the host may queue this many copies before one must have left its buffer


class CopyEvent(Protocol):
    """What the ring needs of an event (torch.cuda.Event's methods): recorded after a copy, queried,
    waited on."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class HostRing:
    """`depth` host buffers taken in turn; a buffer is handed out again only after the event recorded
    after its last copy has completed. `waits` / `wait_s` count the takes that had to block on one."""

    def __init__(self, depth: int = DEPTH, pin: bool = True,
                 make_event: Callable[[], CopyEvent] = torch.cuda.Event):
        if depth < 1:
            raise ValueError(f"a host ring needs at least one buffer, got depth {depth}")
        self.pin = pin
        self._buffers = [torch.empty(0, dtype=torch.uint8) for _ in range(depth)]  # bytes, grown on demand
        self._events = [make_event() for _ in range(depth)]  # an event never recorded counts as complete
        self._current = depth - 1  # the buffer last taken
        self.waits, self.wait_s = 0, 0.0

    @classmethod
    def for_device(cls, device: torch.device, depth: int = DEPTH) -> "HostRing | None":
        """A pinned ring with CUDA events for a CUDA device; None for a CPU (no staging needed)."""
        return cls(depth) if device.type == "cuda" else None

    @property
    def depth(self) -> int:
        return len(self._buffers)

    @property
    def current(self) -> torch.Tensor:
        """The whole buffer (bytes) the last `take` returned a view of."""
        return self._buffers[self._current]

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The next buffer, as a contiguous host tensor of `shape` and `dtype`, once no copy from it is
        pending (waits on its event if the GPU has not yet run that copy). Fill it, then `send` it."""
        self._current = (self._current + 1) % self.depth
        event = self._events[self._current]
        if not event.query():
            t0 = time.perf_counter()
            event.synchronize()
            self.waits, self.wait_s = self.waits + 1, self.wait_s + time.perf_counter() - t0
        nbytes = math.prod(shape) * dtype.itemsize
        if self._buffers[self._current].numel() < nbytes:  # grow to a power of two: few reallocations
            size = 1 << max(nbytes - 1, 63).bit_length()
            self._buffers[self._current] = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        return self._buffers[self._current][:nbytes].view(dtype).view(shape)

    def send(self, buf: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out.copy_(buf) queued without waiting (buf: the tensor `take` just returned, filled), then the
        event that frees buf's buffer. Returns out."""
        if buf.data_ptr() != self.current.data_ptr():
            raise ValueError("send takes the buffer the last take returned")
        out.copy_(buf, non_blocking=True)
        self._events[self._current].record()
        return out

    def upload(self, host: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """A host tensor's values into out (a device tensor of its shape and dtype) through the ring."""
        buf = self.take(tuple(host.shape), host.dtype)
        buf.copy_(host)
        return self.send(buf, out)
