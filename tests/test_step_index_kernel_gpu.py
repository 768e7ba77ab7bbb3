"""The per-step index in one Triton launch (ops/step_index.py) against its torch twin, bitwise.

Run on a GPU machine: `pytest -m gpu tests/test_step_index_kernel_gpu.py`. Where Triton is installed without a
GPU, `TRITON_INTERPRET=1 pytest -m gpu tests/test_step_index_kernel_gpu.py` runs the same checks on the CPU
through Triton's interpreter (indexing and masking, not the compiled code); elsewhere the tests are skipped.

No tolerance: every output is integer arithmetic or a gathered row of a rotary table (copied, never computed),
so the kernel must write exactly the twin's values. Steps: T = 1, 7, 64, 512 tokens of the tiny and Flash plans
(and tiny's with window layers only, or compressed layers only), at positions 0, R - 1, R, R + 1 of each ring,
block ends k*r - 1 of each ratio, the last position; prefill chunks whose window rows lie partly in the step;
padding tokens (tests/test_step_index.py builds them). Rows past T must stay as they were.
"""

from __future__ import annotations

import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS
from test_step_index import TRASH, assert_rows_kept, assert_same, edge_steps, make_plan, meta_rows, static_index

from tp_runtime.ops.kernel_support import pdl_unavailable
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.ops.triton_path import TritonBackend

triton = pytest.importorskip("triton")

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE
PDL = [False] if INTERPRET else [False, True]


def _backend(pdl: bool) -> TritonBackend:
    if pdl and pdl_unavailable(DEV):
        pytest.skip(f"PDL needs {pdl_unavailable(DEV)}")
    return TritonBackend(pdl=pdl)


@pytest.mark.parametrize("pdl", PDL)
@pytest.mark.parametrize("T", [1, 7, 64, 512])
@pytest.mark.parametrize("name", ["tiny", "flash", "window_only", "compressed_only"])
def test_kernel_equals_twin(name, T, pdl):
    backend = _backend(pdl)
    plan, max_len = make_plan(name, DEV)
    for k, chunks in enumerate(edge_steps(plan, T, max_len)):
        meta = meta_rows(chunks, T, DEV)
        before, want, got = (static_index(plan, T + 3, seed=k) for _ in range(3))
        plan.compute_into(want, *meta, trash=TRASH, backend=TorchBackend())
        plan.compute_into(got, *meta, trash=TRASH, backend=backend)
        what = f"{name} T={T} step {k} {chunks[:3]}"
        assert_same(got, want, what)
        assert_rows_kept(got, before, T, what)


@pytest.mark.skipif(INTERPRET, reason="CUDA graph capture needs a GPU")
def test_kernel_replays_in_a_cuda_graph():
    # Captured once on an all-padding step; each replay reads the metadata buffers as they stand then.
    plan, max_len = make_plan("flash", DEV)
    T = 64
    meta = torch.stack(meta_rows([], T, DEV))  # [5, T] static metadata
    got = static_index(plan, T, seed=0)
    backend = _backend(pdl_unavailable(DEV) is None)
    plan.compute_into(got, *meta, trash=TRASH, backend=backend)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.compute_into(got, *meta, trash=TRASH, backend=backend)
    for k, chunks in enumerate(edge_steps(plan, T, max_len)):
        meta.copy_(torch.stack(meta_rows(chunks, T, DEV)))
        graph.replay()
        want = static_index(plan, T, seed=0)
        plan.compute_into(want, *meta, trash=TRASH, backend=TorchBackend())
        assert_same(got, want, f"replay of step {k}")
