"""Message: what rank 0 broadcasts before every turn of the plan loop, one int64 tensor of fixed length.

    [kind, wait_us, plan wire (StepPlan.encode at `capacity` chunks)]

    STEP   every rank runs the plan
    IDLE   nothing runs now; the next request arrives in wait_us microseconds (serve-bench)
    DONE   nothing more runs
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tp_runtime.executor.plan import StepPlan

STEP, IDLE, DONE = 0, 1, 2
HEADER = 2  # kind, wait_us


@dataclass(frozen=True)
class Message:
    kind: int
    wait_us: int = 0
    plan: StepPlan | None = None

    @classmethod
    def step(cls, plan: StepPlan) -> Message:
        return cls(STEP, plan=plan)

    @classmethod
    def idle(cls, wait_s: float) -> Message:
        """Rounded up: rank 0 wakes at or after the arrival."""
        return cls(IDLE, math.ceil(wait_s * 1e6))

    @property
    def wait_s(self) -> float:
        return self.wait_us / 1e6

    @staticmethod
    def size(capacity: int) -> int:
        """Wire length for plans of up to `capacity` chunks."""
        return HEADER + 1 + StepPlan.FIELDS * capacity

    def encode(self, capacity: int) -> torch.Tensor:
        """One list, then one tensor; an empty plan's part is zeros."""
        plan = self.plan.wire_list(capacity) if self.plan is not None else [0] * (self.size(capacity) - HEADER)
        return torch.tensor([self.kind, self.wait_us] + plan, dtype=torch.long)

    @classmethod
    def decode(cls, wire: torch.Tensor) -> Message:
        kind, wait_us = wire[:HEADER].tolist()
        return cls(kind, wait_us, StepPlan.decode_wire(wire[HEADER:]) if kind == STEP else None)
