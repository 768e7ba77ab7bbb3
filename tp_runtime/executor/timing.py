"""Step timing. StepTimer: the device's time per step, CUDA events on GPUs (recorded without waiting, read
after one synchronize at the end), the host clock on CPU. HostLaps: the host's own time per step by part."""

from __future__ import annotations

import time
from typing import Callable

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


class HostLaps:
    """The host's own time per step, by part (ms, host clock): time between marks, less what `blocked()`
    (a running total of seconds the host spent waiting on the GPU, e.g. for a pinned buffer) grew by in it.

        laps.restart(); ...; laps.lap("schedule"); ...; laps.lap("inputs"); ...; laps.end_step()
    """

    def __init__(self, parts: tuple[str, ...], blocked: Callable[[], float] = lambda: 0.0):
        self.parts: dict[str, list[float]] = {p: [] for p in parts}  # part -> ms per step
        self._blocked, self._step = blocked, dict.fromkeys(parts, 0.0)
        self.restart()

    def restart(self) -> None:
        """Mark now: what ran since the last mark counts toward no part (e.g. a wait for outputs)."""
        self._t, self._b = time.perf_counter(), self._blocked()

    def lap(self, part: str) -> None:
        """Add the time since the last mark, less the waits in it, to `part` of the current step; mark now."""
        t, b = time.perf_counter(), self._blocked()
        self._step[part] += ((t - self._t) - (b - self._b)) * 1e3
        self._t, self._b = t, b

    def end_step(self) -> None:
        """Close the current step's laps (parts not lapped count 0)."""
        for part, ms in self._step.items():
            self.parts[part].append(ms)
        self._step = dict.fromkeys(self._step, 0.0)

    def totals_ms(self) -> list[float]:
        """Per step: the sum of its parts."""
        return [sum(step) for step in zip(*self.parts.values())]
