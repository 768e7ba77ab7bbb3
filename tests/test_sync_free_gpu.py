"""The run loop on a GPU makes no synchronizing call per decode step; step inputs made on the device equal
the CPU's bit for bit.

Run on a machine with a GPU: `pytest -m gpu tests/test_sync_free_gpu.py`. The CPU side (the ring's logic,
inputs against the old formulas, the report's host time) is tests/test_sync_free.py.

`torch.cuda.set_sync_debug_mode("error")` makes every call that blocks the host on the device raise: a
`.item()`, `.cpu()`, a copy from or to pageable memory without non_blocking, torch.cuda.synchronize, ops
whose output size depends on values (nonzero, boolean indexing). It does not see event waits
(`Event.synchronize`): the staging rings' waits, which block only while the host is a ring's depth of
steps ahead, are counted instead (`host_wait_s`).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from conftest import TINY_PATH as TINY
from test_sync_free import HIDDEN, PLANS, SEED
from tp_runtime.config import load_config
from tp_runtime.engine.driver import Driver
from tp_runtime.engine.entry import in_process
from tp_runtime.engine.workload import Workload, build_workload
from tp_runtime.executor.worker import Worker
from tp_runtime.parallel.group import resolve_device, single_process

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")
DECODES = [3, 5, 8, 8, 12, 16, 18, 20]
# Eight requests prefilled in the first step (8 x 20 tokens within max_tokens_per_step), then decode-only
# steps of 8 shrinking to 1 sequence: full-graph replays at sizes 8, 4, 2 and 1.
RUN = ["parallel.tp=1", "parallel.launcher=local", "runtime.device=cuda", "graph.mode=full",
       "graph.capture_sizes=[8,4,2,1]", "runtime.max_seqs=8", "runtime.max_tokens_per_step=256"]
DRAWN = ["workload.requests=8", f"workload.prompt_lens={[20] * 8}", f"workload.decode_lens={DECODES}"]


def _input_file(path, prompt: int = 20) -> str:
    """An input file of len(DECODES) requests: `prompt` prompt rows, then DECODES[i] decode rows."""
    g = torch.Generator().manual_seed(5)
    save_file({**{f"input.{i}": torch.randn(prompt + d, HIDDEN, generator=g) for i, d in enumerate(DECODES)},
               "prompt_len": torch.tensor([prompt] * len(DECODES))}, path)
    return str(path)


@pytest.mark.parametrize("source", ["seeded", "file"])
def test_decode_steps_through_the_driver_never_synchronize(tmp_path, source):
    # the same requests and lengths, drawn or from a file (which sets them itself: drawn keys beside it are refused)
    extra = [f"workload.inputs={_input_file(tmp_path / 'in.safetensors')}"] if source == "file" else DRAWN
    cfg = load_config(TINY, RUN + extra)
    # As in_process builds it; capturing the full graphs may synchronize (not a step).
    worker = Worker(cfg, single_process(resolve_device("cuda")))
    try:
        # drive(), taken apart: the same Driver methods, with the sync debug mode on from the first
        # decode-only plan to the last step (the prefill step before it runs eagerly and may synchronize).
        driver = Driver(worker)
        while (plan := driver.next_plan()) is not None and not plan.decode_only:
            driver.step(plan)
        checked = 0
        torch.cuda.set_sync_debug_mode("error")
        try:
            while plan is not None:
                assert plan.decode_only, "a step with a prefill chunk after the decodes began"
                driver.step(plan)
                checked += 1
                plan = driver.next_plan()
            with pytest.raises(RuntimeError):  # the mode is on and would have caught a sync
                torch.ones(1, device=CUDA).item()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        res = driver.finish()  # reads the timings: one synchronize, after the steps
    finally:
        worker.close()
    assert checked == max(DECODES) and res.steps_by_path == {"eager": 1, "full": checked}
    assert sum(res.replays_by_size.values()) == checked and set(res.replays_by_size) == {8, 4, 2, 1}
    assert res.host_ms_per_decode_step is not None and len(res.host_decode_ms) == checked
    print(f"{source}: decode step {res.decode_step_ms_median:.3f} ms on the GPU, "
          f"{res.host_ms_per_decode_step:.3f} ms on the host; by part {res.host_ms_by_part_median}; "
          f"host waited {res.host_wait_s:.4f} s for pinned buffers")
    # The loop taken apart is drive's: a plain run gives the same outputs.
    assert res.output_checksum == in_process(cfg).output_checksum


def test_step_inputs_on_cuda_equal_the_cpu_rows_bit_for_bit(tmp_path):
    # Seeded: the keys are integer hashes (exact anywhere); the rows' float64 log / sqrt / cos run in
    # libm on one side and CUDA on the other, rounded to float32 after: equal here, as the rows sent to
    # the device before were. From a file: the same float32 rows cast to the run dtype (round to nearest
    # even on both sides).
    seeded = Workload([], HIDDEN, SEED)
    f = _input_file(tmp_path / "in.safetensors", prompt=100)  # rows for every plan of PLANS
    from_file = build_workload(load_config(TINY, ["parallel.tp=1", f"workload.inputs={f}"]))
    for dtype in (torch.float32, torch.bfloat16):
        for wl in (seeded, from_file):
            for plan in PLANS * 4:  # more steps than the ring has buffers
                on_cuda = wl.step_inputs(plan, CUDA, dtype)
                assert on_cuda.device.type == "cuda" and on_cuda.dtype == dtype
                assert torch.equal(on_cuda, wl.step_inputs(plan, torch.device("cpu"), dtype).to(CUDA))
