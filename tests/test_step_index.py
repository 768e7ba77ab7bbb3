"""The per-step index (model/step_index.py) as `StepBuffers.compute_index` fills it: `IndexPlan.compute_into`
through the torch backend writes bitwise what `compute` followed by a copy per tensor wrote, only into the
step's rows, and both agree with the index's definitions evaluated per token in plain Python.

The step shapes below (edge positions, chunks, padding) are shared with the Triton kernel's test,
tests/test_step_index_kernel_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import REPO
from tp_runtime.config import ModelConfig, load_config
from tp_runtime.model.step_index import IndexPlan
from tp_runtime.ops.index import StepIndex
from tp_runtime.ops.torch_path import TorchBackend

TRASH = 8  # the trash slot: slots 0..7 hold sequences
Chunk = tuple[int, int, int]  # (slot, start position, length)


def model(name: str) -> ModelConfig:
    return load_config(str(REPO / "configs" / f"{name}.yaml")).model


def plan_for(cfg: ModelConfig, ratios: list[int], max_len: int, device: torch.device) -> IndexPlan:
    """A stack's plan: tables over positions 0..max_len (model/stack.py's max_pos)."""
    return IndexPlan(cfg, ratios, max_len + 1, device)


def layer_ratios(cfg: ModelConfig) -> list[int]:
    return [cfg.compress_ratios[i] for i in cfg.layer_ids()]


def edge_positions(plan: IndexPlan, max_len: int) -> list[int]:
    """0, each ring's R - 1, R, R + 1, each ratio's first two block ends and starts, the last position."""
    edges = {0, 1, max_len - 1} | {p for R in plan.ring_lengths for p in (R - 1, R, R + 1)}
    edges |= {k * r + d for r in plan.ratios for k in (1, 2) for d in (-1, 0)}
    return sorted(p for p in edges if p < max_len)


def edge_steps(plan: IndexPlan, T: int, max_len: int) -> list[list[Chunk]]:
    """Chunk lists of steps of T tokens (padding tokens fill what the chunks leave). T = 1: one decode at each
    edge position, and an all-padding step. Larger T: a mixed step (a prefill chunk from position 0, a chunk
    across each ring's length, decodes at the edge positions, a long chunk across the widest ring's length;
    cut to leave one padding token) and a step that is one chunk of T tokens."""
    edges = edge_positions(plan, max_len)
    if T == 1:
        return [[(i % TRASH, p, 1)] for i, p in enumerate(edges)] + [[]]
    wanted = [(0, 0, 5)] + [(1, max(R - 2, 0), 4) for R in plan.ring_lengths]
    wanted += [(2 + i % (TRASH - 2), p, 1) for i, p in enumerate(edges)]
    wanted.append((7, max(max(plan.ring_lengths) - 30, 0), T))
    mixed, left = [], T - 1
    for slot, start, length in wanted:
        length = min(length, left, max_len - start)
        if length > 0:
            mixed.append((slot, start, length))
            left -= length
    whole = [(3, max(min(max(plan.ring_lengths) - T // 2, max_len - T), 0), T)]
    return [mixed, whole]


def meta_rows(chunks: list[Chunk], T: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The metadata rows (slot, pos, start_idx, start_pos, last_pos), each [T] long, as StepBuffers lays them
    out: padding tokens in the trash slot at position 0, a chunk of their own."""
    rows: list[list[int]] = [[], [], [], [], []]
    for slot, start, length in chunks:
        i = len(rows[0])
        for r, v in zip(rows, ([slot] * length, range(start, start + length), [i] * length, [start] * length,
                               [start + length - 1] * length)):
            r += v
    pad = T - len(rows[0])
    assert pad >= 0
    for r, v in zip(rows, (TRASH, 0, 0, 0, 0)):
        r += [v] * pad
    return tuple(torch.tensor(rows, dtype=torch.long, device=device))


def static_index(plan: IndexPlan, capacity: int, seed: int) -> StepIndex:
    """A static index of `capacity` rows holding an arbitrary earlier step's values (as StepBuffers would)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 100, (capacity,), generator=g)
    meta = (torch.randint(0, TRASH, (capacity,), generator=g), pos, torch.zeros_like(pos), pos, pos)
    device = next(iter(plan.tables.values())).cis.device
    return plan.compute(*(m.to(device) for m in meta), trash=TRASH)


def assert_same(got: StepIndex, want: StepIndex, what: str) -> None:
    """Every tensor bitwise equal, dtype and shape included."""
    for i, (a, b) in enumerate(zip(got.tensors(), want.tensors(), strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: tensor {i}"
        assert torch.equal(a, b), f"{what}: tensor {i} differs at {(a != b).nonzero()[:4].tolist()}"


def assert_rows_kept(got: StepIndex, before: StepIndex, T: int, what: str) -> None:
    """Rows from T on as they were: a step writes only its own rows of the static index."""
    for i, (a, b) in enumerate(zip(got.tensors(), before.tensors(), strict=True)):
        assert torch.equal(a[T:], b[T:]), f"{what}: tensor {i} changed past row {T}"


PLANS = {"tiny": ("tiny", None, 512), "flash": ("v4_flash", None, 4096),
         "window_only": ("tiny", [0], 512), "compressed_only": ("tiny", [4], 512)}


def make_plan(name: str, device: torch.device) -> tuple[IndexPlan, int]:
    """A named plan (the tiny and Flash stacks; tiny's with window layers only, or ratio-4 layers only) and
    its max_len."""
    config, ratios, max_len = PLANS[name]
    cfg = model(config)
    return plan_for(cfg, ratios if ratios is not None else layer_ratios(cfg), max_len, device), max_len


def _check_definitions(ix: StepIndex, plan: IndexPlan, meta: tuple[torch.Tensor, ...], rows: list[int]) -> None:
    """The index at some tokens against its definitions, in Python ints (model/step_index.py's docstrings)."""
    for t in rows:
        slot, pos, sidx, spos, last = (int(m[t]) for m in meta)
        for R, ring in ix.rings.items():
            q = [pos - R + 1 + j for j in range(R)]
            assert ring.in_step[t].tolist() == [p >= spos for p in q]
            assert ring.step_row[t].tolist() == [max(sidx + p - spos, 0) for p in q]
            assert ring.ring_row[t].tolist() == [slot * R + p % R for p in q]  # Python's % floors
            assert ring.valid[t].tolist() == [p >= 0 for p in q]
            assert int(ring.write_row[t]) == (slot if pos > last - R else TRASH) * R + pos % R
        for kind, cis in ix.cis.items():
            assert torch.equal(cis[t], plan.tables[kind].cis[pos])
        for r, blk in ix.blocks.items():
            assert (int(blk.phase[t]), int(blk.block[t]), int(blk.n_done[t])) == (pos % r, pos // r, (pos + 1) // r)
            assert int(blk.emit_slot[t]) == (slot if (pos + 1) % r == 0 else TRASH)
            assert torch.equal(blk.cis[t], plan.tables["compressed"].cis[pos // r * r])


@pytest.mark.parametrize("name", ["tiny", "window_only", "compressed_only"])
def test_backend_twin_equals_compute_then_copy(name):
    plan, max_len = make_plan(name, torch.device("cpu"))
    for T in (1, 7, 64):
        for k, chunks in enumerate(edge_steps(plan, T, max_len)):
            meta = meta_rows(chunks, T, torch.device("cpu"))
            old, new = static_index(plan, T + 3, seed=k), static_index(plan, T + 3, seed=k)
            before = static_index(plan, T + 3, seed=k)
            for dst, src in zip(old.tensors(), plan.compute(*meta, trash=TRASH).tensors()):  # the old way: compute,
                dst[: len(src)].copy_(src)  # then a copy per tensor into the static index
            plan.compute_into(new, *meta, trash=TRASH, backend=TorchBackend())
            assert_same(new, old, f"{name} T={T} step {k}")
            assert_rows_kept(new, before, T, f"{name} T={T} step {k}")
            _check_definitions(new, plan, meta, rows=range(T) if T < 64 else range(0, T, 5))
