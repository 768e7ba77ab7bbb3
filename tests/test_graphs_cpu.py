"""The eager-break decorator outside capture (CPU): a plain call, and eager calls may not return tensors."""

from __future__ import annotations

import pytest
import torch

from tp_runtime.config import load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.graphs import _active, eager_break_during_capture
from conftest import TINY_PATH as TINY


def test_plain_call_outside_capture():
    @eager_break_during_capture
    def f(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x + 1)

    out = torch.zeros(3)
    f(torch.ones(3), out)
    assert torch.equal(out, torch.full((3,), 2.0)) and _active() is None


def test_eager_break_must_not_return():
    @eager_break_during_capture
    def g(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(TypeError, match="must write into its output buffer"):
        g(torch.ones(1))


def test_breakable_request_on_cpu_is_the_eager_path():
    base = ["parallel.tp=1", "runtime.device=cpu", "workload.requests=3"]
    eager = in_process(load_config(TINY, base))
    with pytest.warns(UserWarning, match="needs a CUDA device"):
        breakable = in_process(load_config(TINY, base + ["graph.mode=breakable"]))
    assert breakable.graph == {} and breakable.replayed_steps == 0
    assert breakable.output_checksum == eager.output_checksum
