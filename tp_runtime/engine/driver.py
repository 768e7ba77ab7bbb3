"""The step loop every rank runs: rank 0 schedules and broadcasts each plan, all ranks step it.

Rank 0 also gathers what the report needs: per-request output checksums (and outputs when asked),
step timings from CUDA events (or the host clock on CPU), and the rejected requests.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError

from tp_runtime.executor.plan import StepPlan
from tp_runtime.engine.scheduler import Rejection, Scheduler
from tp_runtime.executor.timing import StepTimer
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
    errors: list[str] = field(default_factory=list)  # what failed after the last step (an output not written)

    @property
    def decode_step_ms_median(self) -> float | None:
        return statistics.median(self.decode_step_ms) if self.decode_step_ms else None


def drive(worker: Worker, oneshot: bool = False, keep_outputs: bool = False) -> RunResult | None:
    """Run the workload to the end; rank 0 returns the result, the other ranks None."""
    cfg, tp, rt = worker.cfg, worker.tp, worker.cfg.runtime
    workload = build_workload(cfg)
    keep = keep_outputs or bool(cfg.workload.dump)
    sched = (Scheduler(workload.requests, rt.max_seqs, rt.max_len, rt.max_tokens_per_step, rt.prefill_chunk,
                       oneshot) if tp.rank == 0 else None)
    res = RunResult(device=str(worker.device), dtype=str(worker.dtype).removeprefix("torch."),
                    kernels=worker.stack.kernels, pdl=worker.stack.backend.pdl,
                    streams=worker.stack.streams, load=worker.load_report, allreduce=worker.allreduce_report)
    parts: dict[int, list[torch.Tensor]] = {}
    checksum = torch.zeros((), dtype=torch.float64, device=worker.device)
    timer, decode_steps = StepTimer(worker.device), []
    t_start = time.perf_counter()
    while (plan := _next_plan(sched, tp, rt.max_seqs)) is not None:
        x = workload.step_inputs(plan, worker.device, worker.dtype)
        t0 = timer.now()
        out, run = worker.step(plan, x)
        timer.stop(t0)
        decode_steps.append(plan.decode_only)
        _count(res, plan, run)
        if sched is not None:
            checksum += out.double().abs().sum()
            if keep:
                _collect(parts, plan, out)
            sched.complete(plan)
    durations = timer.durations_ms()
    res.wall_s = time.perf_counter() - t_start
    if sched is None:
        return None
    res.step_ms = durations
    res.decode_step_ms = [d for d, dec in zip(durations, decode_steps) if dec]
    res.output_checksum = float(checksum)
    res.rejected, res.completed = sched.rejected, len(sched.finished)
    res.graph = _graph_stats(worker)
    if keep:
        res.outputs = {r: torch.cat(p) for r, p in parts.items()}
    if cfg.workload.dump:
        try:  # checked before any rank started; a failure now is reported after the run's report
            write_dump(cfg.workload.dump, workload, res.outputs)
        except (OSError, SafetensorError) as e:
            res.errors.append(f"workload.dump={cfg.workload.dump}: writing the dump failed: {e}")
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
