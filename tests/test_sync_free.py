"""The run loop's host side, on a CPU: step inputs and metadata made the new way (host data through a
ring of staging buffers, rows drawn from hashed keys) equal the old formulas bit for bit; the ring never
hands out a buffer whose copy may still be pending; a run's report carries the host's time per step.

The CUDA side (pinned buffers, real events, no synchronizing call per decode step) is
tests/test_sync_free_gpu.py. On a CPU the runtime bypasses the ring; here the ring's own logic runs on
CPU tensors with a simulated device (FakeGPU) whose copies run only when it is told to.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from safetensors.torch import save_file

from conftest import TINY_PATH
from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.input_staging import InputStaging
from tp_runtime.engine.report import run_record
from tp_runtime.engine.workload import Workload, build_workload
from tp_runtime.executor.buffers import StepBuffers
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.staging import HostRing
from tp_runtime.executor.timing import HostLaps
from tp_runtime.model.step_index import IndexPlan
from tp_runtime.ops.torch_path import TorchBackend

CPU = torch.device("cpu")
HIDDEN, SEED = 64, 11

# Plans: a lone decode token, decodes of many sequences, prefill chunks mixed with decodes (not starting at 0).
PLANS = [
    StepPlan((SeqChunk(3, 1, 17, 1, True),)),
    StepPlan(tuple(SeqChunk(r, r, 40 + 3 * r, 1, True) for r in range(6))),
    StepPlan((SeqChunk(0, 0, 0, 9, False), SeqChunk(5, 2, 30, 1, True), SeqChunk(2, 4, 12, 7, False),
              SeqChunk(7, 3, 99, 1, True))),
]


# ------------------------------------------------------------------ a simulated device for the ring


class FakeGPU:
    """A device that runs nothing until told, for one ring. Each event the ring records follows one copy
    from the buffer just taken; when the device reaches the event (advance, or a host wait on it), the copy
    runs and reads the buffer as it is then. A copy that finds its buffer changed since it was queued
    counts in `rewritten`: the host refilled the buffer while the copy was pending."""

    def __init__(self, honest: bool = True):
        self.queue: list[tuple] = []  # (event, buffer, its bytes when queued): copies not yet run
        self.delivered: list[torch.Tensor] = []  # per copy run, the bytes it read
        self.rewritten = 0
        self.honest = honest  # False: events claim to be complete when they are not (a broken device)
        self.ring: HostRing | None = None

    def make_ring(self, depth: int = 3) -> HostRing:
        self.ring = HostRing(depth, pin=False, make_event=lambda: FakeEvent(self))
        return self.ring

    def advance(self, k: int | None = None) -> None:
        """Run the oldest k queued copies (all with None)."""
        for _ in range(len(self.queue) if k is None else min(k, len(self.queue))):
            ev, source, staged = self.queue.pop(0)
            self.delivered.append(source.clone())
            self.rewritten += not torch.equal(source, staged)
            ev.pending -= 1


class FakeEvent:
    def __init__(self, gpu: FakeGPU):
        self.gpu, self.pending = gpu, 0  # copies this event follows that have not run

    def record(self) -> None:  # right after the ring queued a copy from its current buffer
        self.pending += 1
        self.gpu.queue.append((self, self.gpu.ring.current, self.gpu.ring.current.clone()))

    def query(self) -> bool:
        return self.pending == 0 or not self.gpu.honest

    def synchronize(self) -> None:
        while self.pending:
            self.gpu.advance(1)


def _first(copy: torch.Tensor) -> int:
    return int(copy[:8].view(torch.long)[0])


@pytest.mark.parametrize("gpu_keeps_up", [False, True])
def test_ring_never_hands_out_a_buffer_whose_copy_is_pending(gpu_keeps_up):
    gpu = FakeGPU()
    ring = gpu.make_ring(depth=3)
    for step in range(10):
        shape = (2, 5) if step < 6 else (3, 40)  # the buffers grow part-way (a bigger step)
        buf = ring.take(shape, torch.long)
        assert all(src.data_ptr() != buf.data_ptr() for _, src, _ in gpu.queue), "taken while its copy is queued"
        buf.fill_(step)
        ring.send(buf, torch.empty_like(buf))
        if gpu_keeps_up:
            gpu.advance()
    gpu.advance()
    assert gpu.rewritten == 0 and [_first(d) for d in gpu.delivered] == list(range(10))
    # A device that never catches up on its own: from the 4th take on, each take waited for the copy made
    # from its buffer 3 takes before; a device that keeps up is never waited for.
    assert ring.waits == (0 if gpu_keeps_up else 10 - 3)


def test_the_fake_device_catches_a_buffer_rewritten_too_early():
    # The control for the test above: events that claim completion let the ring reuse a buffer whose copy
    # has not run; its copy then delivers the later values.
    gpu = FakeGPU(honest=False)
    ring = gpu.make_ring(depth=2)
    for step in range(4):
        buf = ring.take((4,), torch.long)
        buf.fill_(step)
        ring.send(buf, torch.empty_like(buf))
    gpu.advance()
    assert gpu.rewritten == 2 and [_first(d) for d in gpu.delivered] == [2, 3, 2, 3]  # not 0, 1, 2, 3


def test_ring_views_bytes_as_any_dtype_and_refuses_a_foreign_buffer():
    ring = FakeGPU().make_ring(depth=2)
    a = ring.take((3, 5), torch.bfloat16)
    assert a.shape == (3, 5) and a.dtype == torch.bfloat16 and a.is_contiguous()
    with pytest.raises(ValueError, match="the buffer the last take returned"):
        ring.send(torch.zeros(3, 5, dtype=torch.bfloat16), torch.empty(3, 5, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="at least one buffer"):
        HostRing(depth=0, pin=False, make_event=lambda: FakeEvent(FakeGPU()))
    assert HostRing.for_device(CPU) is None  # a CPU run has no staging


# ------------------------------------------------------------------ inputs: bit for bit the old formulas


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32, written out here (not imported): the hash the inputs were defined by."""
    m = 0xFFFFFFFF
    x = x & m
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & m
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def _old_seeded(seed: int, plan: StepPlan, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """The step inputs as the previous code made them: per-chunk tensors, the key and both uniforms'
    counters hashed in one expression, Box-Muller."""
    req = torch.cat([torch.full((c.length,), c.request, dtype=torch.long) for c in plan.chunks])
    pos = torch.cat([torch.arange(c.start, c.start + c.length) for c in plan.chunks])
    key = _mix32(_mix32(_mix32(torch.full_like(pos, seed)) ^ req) ^ pos)[:, None]
    index = torch.arange(hidden, dtype=torch.long)[None]
    u1 = (_mix32(key ^ _mix32(2 * index)).double() + 0.5) / 2**32
    u2 = (_mix32(key ^ _mix32(2 * index + 1)).double() + 0.5) / 2**32
    return (torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)).float().to(dtype)


def _staged(staging_ring: bool) -> InputStaging:
    """The CPU path (no ring), or the CUDA path's code on CPU tensors (a ring over a FakeGPU)."""
    ring = FakeGPU().make_ring() if staging_ring else None
    return InputStaging(CPU, HIDDEN, ring=ring)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("staging_ring", [False, True])
def test_seeded_inputs_equal_the_old_formula_bit_for_bit(dtype, staging_ring):
    staging = _staged(staging_ring)
    for plan in PLANS:
        got = staging.seeded(SEED, plan, dtype)
        assert got.dtype == dtype and torch.equal(got, _old_seeded(SEED, plan, HIDDEN, dtype))
    # Workload.step_inputs (its own staging for the device) gives the same rows.
    wl = Workload([], HIDDEN, SEED)
    assert all(torch.equal(wl.step_inputs(p, CPU, dtype), _old_seeded(SEED, p, HIDDEN, dtype)) for p in PLANS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("staging_ring", [False, True])
def test_file_inputs_equal_the_old_formula_bit_for_bit(tmp_path, dtype, staging_ring):
    f = tmp_path / "in.safetensors"
    g = torch.Generator().manual_seed(3)
    # float32 rows with bits below bf16's precision, so the cast's rounding is exercised.
    files = {f"input.{i}": torch.randn(120, HIDDEN, generator=g) * 3 for i in range(8)}
    save_file({**files, "prompt_len": torch.tensor([100] * 8)}, f)
    wl = build_workload(load_config(TINY_PATH, ["parallel.tp=1", f"workload.inputs={f}"]))
    staging = _staged(staging_ring)
    for plan in PLANS:
        old = torch.cat([files[f"input.{c.request}"][c.start: c.start + c.length] for c in plan.chunks]).to(dtype)
        parts = [files[f"input.{c.request}"][c.start: c.start + c.length] for c in plan.chunks]
        assert torch.equal(staging.rows(parts, dtype), old)
        assert torch.equal(wl.step_inputs(plan, CPU, dtype), old)


def _old_meta(plan: StepPlan, n_padded: int, trash: int) -> torch.Tensor:
    """Metadata rows [5, n_padded] (slot, pos, start_idx, start_pos, last_pos) from their definition."""
    cols, i = [], 0
    for c in plan.chunks:
        cols += [(c.slot, c.start + j, i, c.start, c.start + c.length - 1) for j in range(c.length)]
        i += c.length
    cols += [(trash, 0, 0, 0, 0)] * (n_padded - i)  # padding: the trash slot, position 0
    return torch.tensor(cols, dtype=torch.long).T


@pytest.mark.parametrize("staging_ring", [False, True])
def test_step_buffers_load_the_same_metadata_through_the_ring(staging_ring):
    cfg = load_config(TINY_PATH, ["parallel.tp=1"])
    m = cfg.model
    index_plan = IndexPlan(m, [m.compress_ratios[i] for i in m.layer_ids()], 256, CPU)
    gpu = FakeGPU()
    ring = gpu.make_ring() if staging_ring else None
    buffers = StepBuffers(32, HIDDEN, torch.float32, CPU, trash_slot=9, plan=index_plan, backend=TorchBackend(),
                          ring=ring)
    wl, want = Workload([], HIDDEN, SEED), []
    for plan in PLANS * 2:  # more loads than buffers in the ring
        for n_padded in (plan.n_tokens, plan.n_tokens + 5):  # exact and padded
            batch = buffers.load(plan, wl.step_inputs(plan, CPU, torch.float32), n_padded)
            want.append(_old_meta(plan, n_padded, trash=9))
            assert torch.equal(buffers.meta[:, :n_padded], want[-1])
            assert torch.equal(batch.x[plan.n_tokens:], torch.zeros(n_padded - plan.n_tokens, HIDDEN))
    if staging_ring:  # what the (simulated) device's copies read, each when it ran: the rows of its load
        gpu.advance()
        assert gpu.rewritten == 0 and len(gpu.delivered) == len(want)
        rows = [d[: w.numel() * 8].view(torch.long).view(w.shape) for d, w in zip(gpu.delivered, want)]
        assert all(torch.equal(r, w) for r, w in zip(rows, want))
        assert ring.waits == len(want) - ring.depth and buffers.host_wait_s > 0  # it never ran on its own
    else:
        assert buffers.host_wait_s == 0.0


# ------------------------------------------------------------------ the host's time per step


def test_host_laps_leave_out_the_time_spent_waiting():
    blocked = [0.0]  # a running total of seconds "waiting on the GPU", as the rings keep it

    def wait(s: float) -> None:
        t0 = time.perf_counter()
        time.sleep(s)
        blocked[0] += time.perf_counter() - t0

    laps = HostLaps(("a", "b"), lambda: blocked[0])
    for _ in range(2):
        laps.restart()  # tolerances: a lap's own overhead is microseconds; 20 ms covers a loaded 2-core host
        wait(0.05)  # inside part a, but a wait: not host work
        laps.lap("a")
        time.sleep(0.05)  # host time (as far as the laps can tell): counted
        laps.lap("b")
        laps.end_step()
    assert all(abs(ms) < 20 for ms in laps.parts["a"]), laps.parts
    assert all(45 < ms < 500 for ms in laps.parts["b"]), laps.parts
    assert laps.totals_ms() == [a + b for a, b in zip(laps.parts["a"], laps.parts["b"])]


def test_run_report_carries_the_host_time_per_step():
    cfg = load_config(TINY_PATH, ["parallel.tp=1", "workload.requests=3", "workload.prompt_lens=[7, 30, 21]",
                                  "workload.decode_lens=[2, 0, 5]"])
    res = in_process(cfg)
    rec = run_record(cfg, res)
    assert len(res.host_ms) == res.steps and len(res.host_decode_ms) == len(res.decode_step_ms) > 0
    assert 0 < rec["host_ms_per_step"] and 0 < rec["host_ms_per_decode_step"] <= max(res.host_ms)
    assert set(rec["host_ms_by_part"]) == {"schedule", "inputs", "step", "account"}
    # On a CPU the step runs its layers on the host: the step part is most of a step's host time.
    assert rec["host_ms_by_part"]["step"] > rec["host_ms_by_part"]["inputs"]
    assert rec["host_wait_s"] == 0.0  # no pinned buffers on a CPU
