"""Device-side step timing: CUDA events on GPUs (read after one synchronize), the host clock on CPU."""

from __future__ import annotations

import time

import torch


def timer_name(device: torch.device) -> str:
    return "cuda_events" if device.type == "cuda" else "perf_counter (CPU host clock)"


class StepTimer:
    """Start/stop marks of many intervals; `durations_ms` synchronizes once and reads them all."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple] = []

    def now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, t0) -> None:
        self.marks.append((t0, self.now()))

    def durations_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]
