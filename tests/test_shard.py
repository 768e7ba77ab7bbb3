"""A model shard shared by Workers of different break scopes: one copy of weights and caches, the
Workers continuing the same sequences, and refusal of a Worker the shard was not built for."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_PATH
from tp_runtime.config import load_config
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.worker import Worker
from tp_runtime.engine.workload import Workload
from tp_runtime.parallel.group import single_process

CPU = torch.device("cpu")
BASE = ["parallel.tp=1", "runtime.max_seqs=2", "runtime.max_len=200"]


def _cfg(*extra: str):
    return load_config(TINY_PATH, BASE + list(extra))


def _plans() -> list[StepPlan]:
    """A 40-token prompt in slot 0, then 6 decode steps of it."""
    return [StepPlan((SeqChunk(0, 0, 0, 40, False),))] + [
        StepPlan((SeqChunk(0, 0, p, 1, True),)) for p in range(40, 46)]


def test_workers_on_one_shard_continue_the_same_sequences():
    inputs = Workload([], 64, 0)
    alone = Worker(_cfg("graph.break_scope=hoisted"), single_process(CPU))
    wide = Worker(_cfg("graph.break_scope=wide"), single_process(CPU))
    narrow = Worker(_cfg("graph.break_scope=narrow"), single_process(CPU), shard=wide.shard)
    assert narrow.caches is wide.caches and narrow.stack is wide.stack and narrow.buffers is wide.buffers
    for i, plan in enumerate(_plans()):
        x = inputs.step_inputs(plan, CPU, torch.float32)
        ref, _ = alone.step(plan, x)
        out, _ = (wide if i % 2 else narrow).step(plan, x)  # alternate: each step extends the other's
        # Same weights (seeded), same math in every scope on CPU: equal to float32 rounding of op order.
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("override,section", [("runtime.max_len=300", "runtime"),
                                               ("model.layers=0-2", "model")])
def test_a_shard_refuses_a_worker_it_was_not_built_for(override, section):
    shard = Worker(_cfg(), single_process(CPU)).shard
    with pytest.raises(ValueError, match=f"its {section} section differs"):
        Worker(_cfg(override), single_process(CPU), shard=shard)


def test_a_shard_refuses_more_buffer_rows_than_it_has():
    shard = Worker(_cfg(), single_process(CPU)).shard
    with pytest.raises(ValueError, match="buffer rows"):
        Worker(_cfg(), single_process(CPU), oneshot=True, shard=shard)
