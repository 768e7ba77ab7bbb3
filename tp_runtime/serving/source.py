"""serve-bench's plan source (arrivals plus the scheduler) and one setting's run on the engine's plan loop: rank 0
admits the requests that have arrived, schedules, and notes which step emitted which request's tokens.

    result = run_setting(worker, tp, Setting(requests, concurrency=4 | offsets=[...]), inputs, in_flight)

Rank 0's message each turn (executor/message.py): STEP a plan; IDLE when nothing runs and the next request
arrives in wait_us (every rank sleeps, engine/driver.py), after which rank 0 admits what has arrived; DONE when
every request has finished.

A request's first token is done at the end of the step that processed its last prompt token, each later token
at the end of its decode step (clock.py: events, no per-step synchronize). Slots come from a fresh scheduler
per setting (SlotPool; stale cache rows are masked by positions).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import torch

from tp_runtime.engine.driver import PlanLoop
from tp_runtime.engine.scheduler import Scheduler
from tp_runtime.engine.workload import Request, Workload
from tp_runtime.executor.message import DONE, Message
from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.worker import StepRun, Worker
from tp_runtime.parallel.group import TPGroup
from tp_runtime.serving.arrivals import Arrival, ClosedLoop, OpenLoop, ServeRequest
from tp_runtime.serving.clock import StepClock
from tp_runtime.serving.metrics import RequestTrace


@dataclass(frozen=True)
class Setting:
    """What arrives in one run: requests and either a closed loop's concurrency or open-loop offsets (s)."""

    requests: list[ServeRequest]
    concurrency: int | None = None
    offsets: list[float] | None = None


@dataclass
class SettingResult:
    """Rank 0's account of one run."""

    traces: list[RequestTrace]
    steps: int = 0
    decode_steps: int = 0
    decode_eager_steps: int = 0  # decode-only steps that replayed no graph
    steps_by_path: dict[str, int] = field(default_factory=dict)
    max_running: int = 0  # most sequences holding a slot at one step
    idle_waits: int = 0
    outputs_finite: bool = True
    order: list[int] = field(default_factory=list)  # request ids in the order they were admitted
    wall_s: float = 0.0

    @property
    def order_digest(self) -> str:
        return hashlib.sha256(repr(self.order).encode()).hexdigest()[:16]


class ArrivalSource:
    """Rank 0's plan source: arrivals -> scheduler -> the next message; what each step emitted, counted."""

    def __init__(self, w: Worker, setting: Setting, res: SettingResult):
        rt = w.cfg.runtime
        self.sched = Scheduler([], rt.max_seqs, rt.max_len, rt.max_tokens_per_step, rt.prefill_chunk)
        self.source = (ClosedLoop(setting.requests, setting.concurrency) if setting.concurrency is not None
                       else OpenLoop(setting.requests, setting.offsets))
        self.requests = {r.id: r for r in setting.requests}
        self.arrivals: dict[int, Arrival] = {}
        self.token_steps: dict[int, list[int]] = {r.id: [] for r in setting.requests}
        self.res = res
        self.finite = torch.ones((), dtype=torch.bool, device=w.device)

    def next_message(self, now_s: float) -> Message:
        res = self.res
        for req, arrival in self.source.due(now_s):
            self.sched.submit(Request(req.id, req.prompt_len, req.output_len - 1))
            self.arrivals[req.id] = arrival
            res.order.append(req.id)
        if (plan := self.sched.next_plan()) is not None:
            res.max_running = max(res.max_running, len(self.sched.running))
            return Message.step(plan)
        nxt = self.source.next_at()
        return Message(DONE) if nxt is None else Message.idle(max(0.0, nxt - now_s))

    def stepped(self, plan: StepPlan, out: torch.Tensor, run: StepRun, step: int) -> None:
        """A launched step: counted, the tokens it emits, then the scheduler and the closed loop move on."""
        self.finite &= out.isfinite().all()  # on the device: read once at the end
        _count(self.res, plan, run)
        for c in plan.chunks:
            if c.decode or c.start + c.length == self.requests[c.request].prompt_len:
                self.token_steps[c.request].append(step)
        done = len(self.sched.finished)
        self.sched.complete(plan)
        self.source.finished(self.sched.finished[done:], step)

    def traces(self, ends: list[float]) -> list[RequestTrace]:
        return [RequestTrace(r.id, r.prompt_len, r.output_len, self.arrivals[r.id].resolve(ends),
                             [ends[k] for k in self.token_steps[r.id]])
                for r in self.requests.values() if r.id in self.arrivals]


def run_setting(w: Worker, tp: TPGroup, setting: Setting | None, inputs: Workload,
                in_flight: int) -> SettingResult | None:
    """Every rank: step what rank 0 broadcasts until DONE, each step's input rows from `inputs` (hidden states
    by (seed, request, position)). Rank 0 (which alone needs `setting`) returns the result, the others None."""
    res = SettingResult([])
    rank0 = ArrivalSource(w, setting, res) if tp.rank == 0 else None
    clock = StepClock(w.device, in_flight)
    loop = PlanLoop(w, rank0, inputs, clock)
    t_wall = time.perf_counter()
    clock.start()
    loop.run()
    ends = clock.end_times()
    res.wall_s = time.perf_counter() - t_wall
    if rank0 is None:
        return None
    res.idle_waits = loop.idle_waits
    res.traces, res.outputs_finite = rank0.traces(ends), bool(rank0.finite)
    return res


def _count(res: SettingResult, plan: StepPlan, ran: StepRun) -> None:
    res.steps += 1
    res.steps_by_path[ran.path] = res.steps_by_path.get(ran.path, 0) + 1
    if plan.decode_only:
        res.decode_steps += 1
        res.decode_eager_steps += int(ran.size is None)
