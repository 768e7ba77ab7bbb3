"""Continuous batching: requests -> step plans of decode tokens and chunked prefills.

Each step first gives every decoding sequence its next token, then fills the remaining token budget
with prefill chunks (at most `prefill_chunk` tokens of one sequence). Requests wait for a free cache
slot; a finished request frees its slot for the next. A request longer than `max_len` is rejected
at admission with a reason, and the others run unchanged. `oneshot` prefills each request's whole
sequence in one chunk (the reference schedule that `check` compares the incremental one against).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.engine.workload import Request


@dataclass
class _Running:
    req: Request
    slot: int
    done: int = 0  # tokens processed so far


@dataclass(frozen=True)
class Rejection:
    request: int
    reason: str


class Scheduler:
    def __init__(self, requests: list[Request], slots: int, max_len: int, token_budget: int,
                 prefill_chunk: int, oneshot: bool = False):
        self.max_len, self.budget, self.chunk, self.oneshot = max_len, token_budget, prefill_chunk, oneshot
        self.slots = SlotPool(slots)
        self.waiting: deque[Request] = deque(requests)
        self.running: list[_Running] = []  # admission order
        self.rejected: list[Rejection] = []
        self.finished: list[int] = []

    def submit(self, request: Request) -> None:
        """Queue a request that has just arrived (a serving benchmark's arrivals); it is admitted, or rejected,
        with the others, in arrival order, when a slot is free."""
        self.waiting.append(request)

    def _admit(self) -> None:
        while self.waiting and len(self.slots):
            req = self.waiting.popleft()
            if req.total_len > self.max_len:
                self.rejected.append(Rejection(req.id, (
                    f"request {req.id} needs {req.total_len} positions (prompt {req.prompt_len} + decode "
                    f"{req.decode_len}) but runtime.max_len is {self.max_len}")))
                continue
            self.running.append(_Running(req, self.slots.take()))

    def next_plan(self) -> StepPlan | None:
        """The next step's chunks, or None when every request has finished or been rejected."""
        self._admit()
        if not self.running:
            return None
        if self.oneshot:
            s = self.running[0]
            return StepPlan((SeqChunk(s.req.id, s.slot, 0, s.req.total_len, False),))
        chunks, budget = [], self.budget
        for s in self.running:  # decodes first: one token each
            if s.done >= s.req.prompt_len:
                chunks.append(SeqChunk(s.req.id, s.slot, s.done, 1, True))
                budget -= 1
        for s in self.running:  # then prefill chunks while the budget lasts
            if s.done < s.req.prompt_len and budget > 0:
                n = min(s.req.prompt_len - s.done, self.chunk, budget)
                chunks.append(SeqChunk(s.req.id, s.slot, s.done, n, False))
                budget -= n
        return StepPlan(tuple(chunks))

    def complete(self, plan: StepPlan) -> None:
        """Advance every sequence of an executed plan; finished ones free their slots."""
        by_id = {s.req.id: s for s in self.running}
        for c in plan.chunks:
            by_id[c.request].done += c.length
        for s in [s for s in self.running if s.done >= s.req.total_len]:
            self.running.remove(s)
            self.slots.give(s.slot)
            self.finished.append(s.req.id)


class SlotPool:
    """Free cache slots; a finished sequence's slot is reused without clearing (positions mask stale rows)."""

    def __init__(self, n: int):
        self._free = list(range(n - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._free)

    def take(self) -> int:
        return self._free.pop()

    def give(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"slot {slot} returned twice")
        self._free.append(slot)
