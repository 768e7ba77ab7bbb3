"""Step end times without a per-step synchronize: a CUDA event after each step, read once the setting is over.

    clock = StepClock(device, in_flight=2)
    clock.start()                      # t = 0: the device drained, a reference event, the host clock
    clock.wait_turn(); worker.step(...); k = clock.mark()     # per step (engine/driver.py's PlanLoop)
    ends = clock.end_times()           # seconds after t = 0 at which each step's work was done

On a GPU every step gets an event recorded after its work on the current stream; `ref.elapsed_time(ev)` maps
it to the setting's clock, whose zero is the reference event recorded on an idle device (so it completes within
a launch latency, microseconds, of the host's own zero; arrival offsets are read on the host clock). Before
step k is launched the host waits for the event of step k - in_flight: at most `in_flight` steps are queued or
running, so the host, which admits requests and decides the plans, runs at most that far ahead of the device,
and never waits for the step it just launched. On a CPU a step is done when it returns: its end is the host
clock then.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device, in_flight: int = 2):
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.cuda, self.device, self.in_flight = device.type == "cuda", device, in_flight
        self._events: list[torch.cuda.Event] = []
        self._host: list[float] = []
        self._ref: torch.cuda.Event | None = None
        self._t0 = 0.0

    def start(self) -> None:
        """The setting's zero: the device drained (the one synchronize before the steps), then the reference."""
        self._events, self._host = [], []
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
        self._t0 = time.perf_counter()

    def now(self) -> float:
        """Host seconds since the setting's zero."""
        return time.perf_counter() - self._t0

    @property
    def steps(self) -> int:
        return len(self._events) if self.cuda else len(self._host)

    def wait_turn(self) -> None:
        """Block until step k - in_flight is done, k being the step about to be launched (GPU only)."""
        if self.cuda and len(self._events) >= self.in_flight:
            self._events[-self.in_flight].synchronize()

    def begin(self) -> None:
        """Nothing to mark as a step is launched: its end is what counts (the plan loop's clock shape)."""

    def mark(self) -> int:
        """The end of the step just launched; returns its index."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append(ev)
        else:
            self._host.append(self.now())
        return self.steps - 1

    def end_times(self) -> list[float]:
        """Seconds after the zero at which each step was done (synchronizes on the last step's event)."""
        if not self.cuda:
            return list(self._host)
        if self._events:
            self._events[-1].synchronize()
        return [self._ref.elapsed_time(ev) / 1e3 for ev in self._events]
