"""Per-step index tensors: built once per step from the batch metadata, read by every layer.

Every layer of a stack asks the same questions of a step: where each token finds the rows of its
last R positions (window ring, compressor state rings), where its own row is stored, which
compressed block it completes, and its rotary angles. Answering them in each layer costs some 40
small kernels per layer; here they are answered once per step into static buffers (`StepBuffers`),
before a graph replays, so captured segments and eager breaks read the same tensors. `IndexPlan.compute_into`
fills them through the kernel backend: one Triton launch (ops/step_index.py), or its torch twin.

The index types it fills (RingIndex, BlockIndex, StepIndex) are the kernels' own: ops/index.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tp_runtime.config import ModelConfig
from tp_runtime.model.rope import RotaryTable
from tp_runtime.ops.index import BlockIndex, RingIndex, StepIndex, ring_length
from tp_runtime.ops.torch_path import block_rows, ring_rows

if TYPE_CHECKING:
    from tp_runtime.ops.select import KernelBackend


class IndexPlan:
    """What a stack's layers read: ring lengths, compress ratios and rotary tables (shared by layers)."""

    def __init__(self, cfg: ModelConfig, ratios: list[int], max_pos: int, device: torch.device,
                 dtype: torch.dtype = torch.float32):
        """dtype: the run's (a float64 run's rotary tables are complex128)."""
        compress = sorted({r for r in ratios if r})
        self.ring_lengths = sorted({cfg.sliding_window} | {ring_length(r) for r in compress})
        self.ratios = compress
        self.tables = {kind: RotaryTable.for_kind(cfg, kind, max_pos, device, dtype)
                       for kind in sorted({"compressed" if r else "window" for r in ratios})}

    def compute(self, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
                last_pos: torch.Tensor, trash: int) -> StepIndex:
        """The index of tokens with these metadata rows (each [T] long)."""
        rings = {R: ring_index(R, slot, pos, start_idx, start_pos, last_pos, trash) for R in self.ring_lengths}
        cis = {kind: table.at(pos) for kind, table in self.tables.items()}
        blocks = {r: block_index(r, slot, pos, trash, self.tables["compressed"]) for r in self.ratios}
        return StepIndex(rings, cis, blocks)

    def compute_into(self, index: StepIndex, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor,
                     start_pos: torch.Tensor, last_pos: torch.Tensor, trash: int, backend: "KernelBackend") -> None:
        """`compute`'s values for T tokens written into the first T rows of index (one this plan computed), by
        the backend's `step_index`: on the Triton backend one launch, no intermediate tensors."""
        angles = [(self.tables[kind].cis, out) for kind, out in index.cis.items()]
        table = self.tables["compressed"].cis if self.ratios else None
        backend.step_index(slot, pos, start_idx, start_pos, last_pos, trash, index.rings, angles, index.blocks, table)


def ring_index(R: int, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
               last_pos: torch.Tensor, trash: int) -> RingIndex:
    """Where each token (metadata rows [T]) reads and writes a ring of R rows."""
    return RingIndex(*ring_rows(R, slot, pos, start_idx, start_pos, last_pos, trash))


def block_index(r: int, slot: torch.Tensor, pos: torch.Tensor, trash: int, table: RotaryTable) -> BlockIndex:
    """Each token's compressed block for ratio r; rotary angles from table."""
    return BlockIndex(*block_rows(r, slot, pos, trash, table.cis))
