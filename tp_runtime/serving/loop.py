"""One setting's step loop on every rank: rank 0 admits the requests that have arrived, schedules, and
broadcasts each message; every rank runs it; rank 0 notes which step emitted which request's tokens.

    result = run_setting(worker, tp, Setting(requests, concurrency=4 | offsets=[...]), inputs, in_flight)

Messages go from rank 0 over the CPU group, as engine/driver.py's plans do: an int64 tensor
[kind, wait_us, plan wire (StepPlan.encode at runtime.max_seqs chunks)].

    STEP   every rank runs the plan
    IDLE   nothing runs and the next request arrives in wait_us: every rank sleeps that long and then meets
           at the next message (no rank sits in a collective meanwhile, so an arrival far off cannot run into
           parallel.timeout_s, and nobody spins); rank 0 then admits what has arrived
    DONE   every request has finished

A request's first token is done at the end of the step that processed its last prompt token, each later token
at the end of its decode step (clock.py: events, no per-step synchronize). Slots come from a fresh scheduler
per setting (SlotPool; stale cache rows are masked by positions).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

import torch

from tp_runtime.engine.scheduler import Scheduler
from tp_runtime.engine.workload import Request, Workload
from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.worker import Worker
from tp_runtime.parallel.group import TPGroup
from tp_runtime.serving.arrivals import Arrival, ClosedLoop, OpenLoop, ServeRequest
from tp_runtime.serving.clock import StepClock
from tp_runtime.serving.metrics import RequestTrace

STEP, IDLE, DONE = 0, 1, 2
HEADER = 2  # kind, wait_us
PEER_EARLY_S = 0.002  # ranks other than 0 end an idle wait this much early, to be at the broadcast first


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


class _Rank0:
    """Rank 0's side: arrivals -> scheduler -> the next message; what each step emitted."""

    def __init__(self, w: Worker, setting: Setting):
        rt = w.cfg.runtime
        self.sched = Scheduler([], rt.max_seqs, rt.max_len, rt.max_tokens_per_step, rt.prefill_chunk)
        self.source = (ClosedLoop(setting.requests, setting.concurrency) if setting.concurrency is not None
                       else OpenLoop(setting.requests, setting.offsets))
        self.requests = {r.id: r for r in setting.requests}
        self.arrivals: dict[int, Arrival] = {}
        self.token_steps: dict[int, list[int]] = {r.id: [] for r in setting.requests}
        self.capacity = rt.max_seqs

    def next_message(self, now_s: float, res: SettingResult) -> torch.Tensor:
        for req, arrival in self.source.due(now_s):
            self.sched.submit(Request(req.id, req.prompt_len, req.output_len - 1))
            self.arrivals[req.id] = arrival
            res.order.append(req.id)
        if (plan := self.sched.next_plan()) is not None:
            res.max_running = max(res.max_running, len(self.sched.running))
            return _wire(self.capacity, STEP, plan=plan)
        nxt = self.source.next_at()
        return _wire(self.capacity, DONE) if nxt is None else _wire(self.capacity, IDLE, max(0.0, nxt - now_s))

    def stepped(self, plan: StepPlan, step: int) -> None:
        """A launched step: the tokens it emits, then the scheduler and the closed loop move on."""
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


def _wire(capacity: int, kind: int, wait_s: float = 0.0, plan: StepPlan | None = None) -> torch.Tensor:
    wire = torch.zeros(HEADER + 1 + StepPlan.FIELDS * capacity, dtype=torch.long)
    wire[0], wire[1] = kind, math.ceil(wait_s * 1e6)  # up: rank 0 wakes at or after the arrival
    if plan is not None:
        wire[HEADER:] = plan.encode(capacity)
    return wire


def run_setting(w: Worker, tp: TPGroup, setting: Setting | None, inputs: Workload,
                in_flight: int) -> SettingResult | None:
    """Every rank: step what rank 0 broadcasts until DONE, each step's input rows from `inputs` (hidden states
    by (seed, request, position)). Rank 0 (which alone needs `setting`) returns the result, the others None."""
    rank0 = _Rank0(w, setting) if tp.rank == 0 else None
    res = SettingResult([])
    clock = StepClock(w.device, in_flight)
    finite = torch.ones((), dtype=torch.bool, device=w.device)
    t_wall = time.perf_counter()
    clock.start()
    while True:
        wire = rank0.next_message(clock.now(), res) if rank0 else _wire(w.cfg.runtime.max_seqs, DONE)
        tp.broadcast_from_driver(wire)
        kind, wait_s = int(wire[0]), int(wire[1]) / 1e6
        if kind == DONE:
            break
        if kind == IDLE:
            res.idle_waits += 1
            time.sleep(wait_s if rank0 else max(0.0, wait_s - PEER_EARLY_S))
            continue
        plan = StepPlan.decode_wire(wire[HEADER:])
        clock.wait_turn()
        out, ran = w.step(plan, inputs.step_inputs(plan, w.device, w.dtype))
        step = clock.mark()
        if rank0 is None:
            continue
        finite &= out.isfinite().all()  # on the device: read once at the end
        _count(res, plan, ran)
        rank0.stepped(plan, step)
    ends = clock.end_times()
    res.wall_s = time.perf_counter() - t_wall
    if rank0 is None:
        return None
    res.traces, res.outputs_finite = rank0.traces(ends), bool(finite)
    return res


def _count(res: SettingResult, plan: StepPlan, ran) -> None:
    res.steps += 1
    res.steps_by_path[ran.path] = res.steps_by_path.get(ran.path, 0) + 1
    if plan.decode_only:
        res.decode_steps += 1
        res.decode_eager_steps += int(ran.size is None)
