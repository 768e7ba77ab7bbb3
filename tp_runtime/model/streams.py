"""The side stream of stage B: a second CUDA stream that forks from the current stream and joins back to it.

    fork()     the side stream waits for everything issued so far on the current stream
    branch()   work issued inside runs on the side stream (no wait of its own)
    join()     the current stream waits for everything issued so far on the side stream

Inside a CUDA-graph capture the fork and the join become edges of the captured graph (the side stream
joins the capture through the fork's event, and its allocations go to the graph's pool), so a replay runs
both branches concurrently with no host work. Outside capture each is one event record and one wait. The
stream and its two events are made once per stack and reused by every layer and step: a wait binds to the
event's latest record at the time it is issued, so recording the same event again later is safe. The
caller's stream issues everything else, the all-reduce included (one stream issues the collective).

Memory: a tensor made on one branch and read on the other stays referenced by the layer until after the
join, and each fork orders later side work after the current stream's work so far, so the caching
allocator never hands out a block the other stream still reads (no record_stream needed).

`Inline` has the same interface on one stream (CPU, runtime.streams=1, layers with nothing to overlap):
the branches run in place, in program order.
"""

from __future__ import annotations

import contextlib

import torch


class SideStream:
    overlaps = True

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._fork, self._join = torch.cuda.Event(), torch.cuda.Event()

    def fork(self) -> None:
        self._fork.record(torch.cuda.current_stream(self.device))
        self.stream.wait_event(self._fork)

    def branch(self) -> torch.cuda.StreamContext:
        return torch.cuda.stream(self.stream)

    def join(self) -> None:
        self._join.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(self._join)


class Inline:
    overlaps = False

    def fork(self) -> None:
        pass

    def branch(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def join(self) -> None:
        pass


INLINE = Inline()
