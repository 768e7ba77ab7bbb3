"""The plan loop every rank runs (PlanLoop), and `run`'s use of it (Driver, drive).

PlanLoop: rank 0's plan source decides each message (executor/message.py: STEP a plan, IDLE a wait, DONE) and
broadcasts it; every rank runs each step. The source is the scheduler for `run` (Driver) and arrivals plus the
scheduler for `serve-bench` (serving/source.py); a step clock marks each step on every rank (`run`: its device
time; `serve-bench`: its end, at most `in_flight` steps queued). An IDLE message: every rank sleeps the wait
(ranks other than 0 end it PEER_EARLY_S early, to be at the broadcast first), so no rank sits in a collective
meanwhile and an arrival far off cannot run into parallel.timeout_s; then rank 0 decides again.

For `run`, rank 0 also gathers what the report needs: per-request output checksums (and outputs when asked),
step timings from CUDA events (or the host clock on CPU), the host's own time per step, and the
rejected requests.

`run`'s loop never waits on the GPU for a decode step that replays a full graph: a step's inputs and
metadata reach the device through pinned buffers copied non_blocking (`executor/staging.py`), the
checksum accumulates on the device, the step timer records CUDA events and reads them once at the end,
and the plan broadcast goes over the CPU (gloo) group. So the host schedules step k+1 (and at tp > 1
broadcasts its plan) while the GPU still runs step k; it waits only when it is a ring's depth (3) of
steps ahead, for the pinned buffer it is about to refill. What still waits on the GPU, by design:
keeping outputs (`keep_outputs`, `workload.dump`: each step's rows are copied to the host, `_collect`)
and the end of the run (one synchronize to read the timings, one read of the checksum).
tests/test_sync_free_gpu.py runs full-graph decode steps through this loop under
`torch.cuda.set_sync_debug_mode("error")`; other paths (eager steps, breakable graphs and their eager
breaks) run the same loop, but their model code is not held to it there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from safetensors import SafetensorError

from tp_runtime.engine.scheduler import Rejection, Scheduler
from tp_runtime.engine.workload import Workload, build_workload, write_dump
from tp_runtime.executor.message import DONE, IDLE, Message
from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.timing import HostLaps, StepTimer
from tp_runtime.executor.worker import StepRun, Worker

PEER_EARLY_S = 0.002  # ranks other than 0 end an idle wait this much early, to be at the broadcast first
HOST_PARTS = ("schedule", "inputs", "step", "account")  # HostLaps parts of one loop iteration (README)


@dataclass
class RunResult:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    replayed_steps: int = 0
    replays_by_size: dict[int, int] = field(default_factory=dict)
    steps_by_path: dict[str, int] = field(default_factory=dict)  # "full" | "breakable" | "eager" -> steps
    wall_s: float = 0.0
    step_ms: list[float] = field(default_factory=list)
    decode_step_ms: list[float] = field(default_factory=list)
    output_checksum: float = 0.0
    rejected: list[Rejection] = field(default_factory=list)
    completed: int = 0
    outputs: dict[int, torch.Tensor] | None = None  # request id -> [L, hidden] fp32 (cpu)
    device: str = ""
    dtype: str = ""
    kernels: str = ""  # the resolved runtime.kernels: torch | triton
    pdl: bool = False  # the resolved runtime.pdl: Triton kernels launched with programmatic dependent launch
    streams: int = 1  # streams stage B runs on (runtime.streams on CUDA; 1 on a CPU)
    graph: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    allreduce: dict = field(default_factory=dict)  # the chosen all-reduce and why (Worker.allreduce_report)
    host_ms: list[float] = field(default_factory=list)  # per step: the host's own time (HostLaps, every part)
    host_decode_ms: list[float] = field(default_factory=list)  # the same, decode-only steps
    host_ms_by_part: dict[str, list[float]] = field(default_factory=dict)  # HOST_PARTS -> ms per step
    host_wait_s: float = 0.0  # the host waiting for a pinned buffer: it was a ring's depth of steps ahead
    errors: list[str] = field(default_factory=list)  # what failed after the last step (an output not written)

    @property
    def decode_step_ms_median(self) -> float | None:
        return statistics.median(self.decode_step_ms) if self.decode_step_ms else None

    @property
    def host_ms_per_step(self) -> float | None:
        return statistics.median(self.host_ms) if self.host_ms else None

    @property
    def host_ms_per_decode_step(self) -> float | None:
        return statistics.median(self.host_decode_ms) if self.host_decode_ms else None

    @property
    def host_ms_by_part_median(self) -> dict[str, float]:
        return {p: statistics.median(v) for p, v in self.host_ms_by_part.items() if v}


class PlanSource(Protocol):
    """Rank 0's side of the loop: each turn's message, and what each launched step gave."""

    def next_message(self, now_s: float) -> Message:
        """The next message; now_s: the clock's host seconds."""

    def stepped(self, plan: StepPlan, out: torch.Tensor, run: StepRun, step: int) -> None:
        """A launched step (its index on the clock): its outputs [n_tokens, hidden] and how it ran."""


class StepClock(Protocol):
    """Every rank's marks around each step of the loop."""

    def now(self) -> float:
        """Host seconds since the loop's zero (what rank 0's source reads)."""

    def wait_turn(self) -> None:
        """Before a step's inputs: may wait for an earlier step to end."""

    def begin(self) -> None:
        """The step is about to be launched."""

    def mark(self) -> int:
        """The step was launched; returns its index."""


class PlanLoop:
    """One rank's loop over rank 0's messages: `next_plan`, `step` it, ... until None. Host time per step is
    lapped by part (HOST_PARTS): schedule (rank 0's source, the broadcast), inputs (`Workload.step_inputs`), step
    (`Worker.step`: buffer loads and the replay or eager launch), account (rank 0's source hears of the step),
    each less what `blocked` (seconds the host waited on the GPU, a running total) grew by in it."""

    def __init__(self, worker: Worker, source: PlanSource | None, inputs: Workload, clock: StepClock,
                 blocked: Callable[[], float] = lambda: 0.0):
        self.worker, self.source, self.inputs, self.clock = worker, source, inputs, clock
        self.capacity = worker.cfg.runtime.max_seqs
        self.laps = HostLaps(HOST_PARTS, blocked)
        self.idle_waits = 0

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, the same on every rank (idle waits slept through); None: done."""
        while True:
            self.laps.restart()
            msg = self._message()
            self.laps.lap("schedule")
            if msg.kind != IDLE:
                return None if msg.kind == DONE else msg.plan
            self.idle_waits += 1
            time.sleep(msg.wait_s if self.source is not None else max(0.0, msg.wait_s - PEER_EARLY_S))

    def _message(self) -> Message:
        """Rank 0 asks its source and broadcasts; every rank returns the same message."""
        if self.source is not None:
            wire = self.source.next_message(self.clock.now()).encode(self.capacity)
        else:
            wire = torch.empty(Message.size(self.capacity), dtype=torch.long)
        self.worker.tp.broadcast_from_driver(wire)
        return Message.decode(wire)

    def step(self, plan: StepPlan) -> None:
        """Run one step and tell rank 0's source. Waits on the device only where the clock or the source does."""
        w = self.worker
        self.clock.wait_turn()
        x = self.inputs.step_inputs(plan, w.device, w.dtype)
        self.laps.lap("inputs")
        self.clock.begin()
        out, run = w.step(plan, x)
        k = self.clock.mark()
        self.laps.lap("step")
        if self.source is not None:
            self.source.stepped(plan, out, run, k)
        self.laps.lap("account")
        self.laps.end_step()

    def run(self) -> None:
        """Every step until DONE."""
        while (plan := self.next_plan()) is not None:
            self.step(plan)


class StepTimes:
    """`run`'s step clock: each step's device time from its launch to its end (StepTimer); it never waits."""

    def __init__(self, device: torch.device):
        self.timer, self._t0 = StepTimer(device), None
        self._zero = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._zero

    def wait_turn(self) -> None:
        pass

    def begin(self) -> None:
        self._t0 = self.timer.now()

    def mark(self) -> int:
        self.timer.stop(self._t0)
        return len(self.timer.marks) - 1


def drive(worker: Worker, oneshot: bool = False, keep_outputs: bool = False) -> RunResult | None:
    """Run the workload to the end; rank 0 returns the result, the other ranks None."""
    driver = Driver(worker, oneshot, keep_outputs)
    while (plan := driver.next_plan()) is not None:
        driver.step(plan)
    return driver.finish()


class Driver:
    """One rank's run of a workload on the plan loop, a step at a time: `next_plan`, `step` it, ... until None,
    `finish`. On rank 0 it is the loop's plan source: the scheduler decides, and each step is accounted for
    (counts, the checksum on the device, outputs when kept, completion).

    `drive` is exactly that loop; tests run it by hand to check a stretch of its steps
    (tests/test_sync_free_gpu.py). The host's own time per step is lapped by part (PlanLoop), less the time the
    host waited for a pinned buffer (the GPU) and, with outputs kept, for the outputs.
    """

    def __init__(self, worker: Worker, oneshot: bool = False, keep_outputs: bool = False):
        cfg, rt = worker.cfg, worker.cfg.runtime
        self.worker, self.workload = worker, build_workload(cfg)
        self.keep = keep_outputs or bool(cfg.workload.dump)
        self.sched = (Scheduler(self.workload.requests, rt.max_seqs, rt.max_len, rt.max_tokens_per_step,
                                rt.prefill_chunk, oneshot) if worker.tp.rank == 0 else None)
        self.res = RunResult(device=str(worker.device), dtype=str(worker.dtype).removeprefix("torch."),
                             kernels=worker.stack.kernels, pdl=worker.stack.backend.pdl,
                             streams=worker.stack.streams, load=worker.load_report, allreduce=worker.allreduce_report)
        self._parts: dict[int, list[torch.Tensor]] = {}
        self._checksum = torch.zeros((), dtype=torch.float64, device=worker.device)
        self._times, self._decode_steps, self._collect_s = StepTimes(worker.device), [], 0.0
        self.loop = PlanLoop(worker, self if worker.tp.rank == 0 else None, self.workload, self._times,
                             lambda: self._host_wait_s() + self._collect_s)
        self._t_start = time.perf_counter()

    def _host_wait_s(self) -> float:
        return self.workload.input_wait_s + self.worker.buffers.host_wait_s

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, the same on every rank (rank 0 schedules and broadcasts); None: done."""
        return self.loop.next_plan()

    def step(self, plan: StepPlan) -> None:
        """Run one step and account for it. Queues device work and waits on none of it, except to copy
        the step's outputs to the host when they are kept."""
        self.loop.step(plan)

    # ------------------------------------------------------------ the plan source (rank 0)

    def next_message(self, now_s: float) -> Message:
        plan = self.sched.next_plan()
        return Message.step(plan) if plan is not None else Message(DONE)

    def stepped(self, plan: StepPlan, out: torch.Tensor, run: StepRun, step: int) -> None:
        self._decode_steps.append(plan.decode_only)
        _count(self.res, plan, run)
        self._checksum += out.double().abs().sum()  # on the device: read once, in finish
        if self.keep:
            t = time.perf_counter()
            _collect(self._parts, plan, out)  # .cpu(): waits for this step; not the host's own time
            self._collect_s += time.perf_counter() - t
        self.sched.complete(plan)

    def finish(self) -> RunResult | None:
        """Read the timings (one synchronize), write the dump; rank 0's result, None elsewhere."""
        durations = self._times.timer.durations_ms()
        res, sched, laps = self.res, self.sched, self.loop.laps
        res.wall_s = time.perf_counter() - self._t_start
        if sched is None:
            return None
        res.step_ms = durations
        res.decode_step_ms = [d for d, dec in zip(durations, self._decode_steps) if dec]
        res.host_ms, res.host_ms_by_part = laps.totals_ms(), laps.parts
        res.host_decode_ms = [h for h, dec in zip(res.host_ms, self._decode_steps) if dec]
        res.host_wait_s = self._host_wait_s()
        res.output_checksum = float(self._checksum)
        res.rejected, res.completed = sched.rejected, len(sched.finished)
        res.graph = _graph_stats(self.worker)
        if self.keep:
            res.outputs = {r: torch.cat(p) for r, p in self._parts.items()}
        dump = self.worker.cfg.workload.dump
        if dump:
            try:  # checked before any rank started; a failure now is reported after the run's report
                write_dump(dump, self.workload, res.outputs)
            except (OSError, SafetensorError) as e:
                res.errors.append(f"workload.dump={dump}: writing the dump failed: {e}")
        return res


def _count(res: RunResult, plan: StepPlan, run: StepRun) -> None:
    res.steps += 1
    res.steps_by_path[run.path] = res.steps_by_path.get(run.path, 0) + 1
    if run.size is not None:
        res.replayed_steps += 1
        res.replays_by_size[run.size] = res.replays_by_size.get(run.size, 0) + 1
    for c in plan.chunks:
        if c.decode:
            res.decode_tokens += c.length
        else:
            res.prefill_tokens += c.length


def _collect(parts: dict[int, list[torch.Tensor]], plan: StepPlan, out: torch.Tensor) -> None:
    rows = out.to(torch.promote_types(out.dtype, torch.float32)).cpu()  # float64 runs keep float64 outputs
    i = 0
    for c in plan.chunks:
        parts.setdefault(c.request, []).append(rows[i: i + c.length])
        i += c.length


def _graph_stats(worker: Worker) -> dict:
    """Per graph kind ("full", "breakable") its capture sizes, capture seconds, segments, breaks, pool bytes."""
    return {g.kind: g.stats() for g in worker.graph_sets}
