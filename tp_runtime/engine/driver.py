"""The step loop every rank runs: rank 0 schedules and broadcasts each plan, all ranks step it.

Rank 0 also gathers what the report needs: per-request output checksums (and outputs when asked),
step timings from CUDA events (or the host clock on CPU), the host's own time per step, and the
rejected requests.

The loop never waits on the GPU for a decode step that replays a full graph: a step's inputs and
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
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError

from tp_runtime.executor.plan import StepPlan
from tp_runtime.engine.scheduler import Rejection, Scheduler
from tp_runtime.executor.timing import HostLaps, StepTimer
from tp_runtime.executor.worker import StepRun, Worker
from tp_runtime.engine.workload import build_workload, write_dump


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


HOST_PARTS = ("schedule", "inputs", "step", "account")  # HostLaps parts of one loop iteration (README)


def drive(worker: Worker, oneshot: bool = False, keep_outputs: bool = False) -> RunResult | None:
    """Run the workload to the end; rank 0 returns the result, the other ranks None."""
    driver = Driver(worker, oneshot, keep_outputs)
    while (plan := driver.next_plan()) is not None:
        driver.step(plan)
    return driver.finish()


class Driver:
    """One rank's run of a workload, a step at a time: `next_plan`, `step` it, ... until None, `finish`.

    `drive` is exactly that loop; tests run it by hand to check a stretch of its steps
    (tests/test_sync_free_gpu.py). Host time per step is lapped by part (HOST_PARTS): schedule (rank 0's
    scheduler, the plan broadcast), inputs (`Workload.step_inputs`), step (`Worker.step`: buffer loads and
    the replay or eager launch), account (checksum launch, counts, completion), each less the time the
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
        self._timer, self._decode_steps = StepTimer(worker.device), []
        self._laps = HostLaps(HOST_PARTS, self._host_wait_s)
        self._t_start = time.perf_counter()

    def _host_wait_s(self) -> float:
        return self.workload.input_wait_s + self.worker.buffers.host_wait_s

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, the same on every rank (rank 0 schedules and broadcasts); None: done."""
        self._laps.restart()
        plan = _next_plan(self.sched, self.worker.tp, self.worker.cfg.runtime.max_seqs)
        self._laps.lap("schedule")
        return plan

    def step(self, plan: StepPlan) -> None:
        """Run one step and account for it. Queues device work and waits on none of it, except to copy
        the step's outputs to the host when they are kept."""
        w = self.worker
        x = self.workload.step_inputs(plan, w.device, w.dtype)
        self._laps.lap("inputs")
        t0 = self._timer.now()
        out, run = w.step(plan, x)
        self._timer.stop(t0)
        self._laps.lap("step")
        self._decode_steps.append(plan.decode_only)
        _count(self.res, plan, run)
        if self.sched is not None:
            self._checksum += out.double().abs().sum()  # on the device: read once, in finish
            if self.keep:
                self._laps.lap("account")
                _collect(self._parts, plan, out)  # .cpu(): waits for this step; not the host's own time
                self._laps.restart()
            self.sched.complete(plan)
        self._laps.lap("account")
        self._laps.end_step()

    def finish(self) -> RunResult | None:
        """Read the timings (one synchronize), write the dump; rank 0's result, None elsewhere."""
        durations = self._timer.durations_ms()
        res, sched = self.res, self.sched
        res.wall_s = time.perf_counter() - self._t_start
        if sched is None:
            return None
        res.step_ms = durations
        res.decode_step_ms = [d for d, dec in zip(durations, self._decode_steps) if dec]
        res.host_ms, res.host_ms_by_part = self._laps.totals_ms(), self._laps.parts
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


def _next_plan(sched: Scheduler | None, tp, capacity: int) -> StepPlan | None:
    """Rank 0 decides the next step and broadcasts it; every rank returns the same plan (None: done)."""
    wire = torch.full((1 + StepPlan.FIELDS * capacity,), -1, dtype=torch.long)
    if sched is not None and (plan := sched.next_plan()) is not None:
        wire = plan.encode(capacity)
    tp.broadcast_from_driver(wire)
    return None if int(wire[0]) < 0 else StepPlan.decode_wire(wire)


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
    rows = out.float().cpu()
    i = 0
    for c in plan.chunks:
        parts.setdefault(c.request, []).append(rows[i: i + c.length])
        i += c.length


def _graph_stats(worker: Worker) -> dict:
    """Per graph kind ("full", "breakable") its capture sizes, capture seconds, segments, breaks, pool bytes."""
    return {g.kind: g.stats() for g in worker.graph_sets}
