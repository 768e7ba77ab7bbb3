"""The index types every kernel reads, and the compressor state rings they update.

A step's index (RingIndex per ring length, BlockIndex per compress ratio, StepIndex holding them and the
rotary angles) is built once per step by model/step_index.py and read by both backends; RingState is a
compressor's state ring as the caches hold it (model/cache.py). They sit here, with the kernels, so that
ops/ names its own argument types and imports nothing of the model.

Shapes below: T tokens of the step (padded), R rows of a ring, Dr/2 rotary pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


def ring_length(ratio: int) -> int:
    """Rows of a compressor's state ring: c*r tokens (c = 2 for the overlapping ratio-4 compressor)."""
    return (2 if ratio == 4 else 1) * ratio


@dataclass
class RingState:
    """The last c*r tokens' compressor inputs: kv [slots, c*r, c*D] and score (+ape) of the same shape, fp32
    (float64 in a float64 run)."""

    kv: torch.Tensor
    score: torch.Tensor

    @classmethod
    def empty(cls, slots: int, ratio: int, dim: int, device: torch.device,
              run_dtype: torch.dtype = torch.float32) -> "RingState":
        rows = ring_length(ratio)
        shape = (slots, rows, rows // ratio * dim)
        dtype = torch.promote_types(run_dtype, torch.float32)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))


class RingIndex(NamedTuple):
    """Rows of positions pos - R + 1 .. pos of each token's sequence (oldest first), for a ring of R rows.

    A position inside this step's chunk of the sequence is read from the step's own rows (the ring
    may already hold later rows of the chunk); an earlier one from the ring at row pos % R.
    """

    in_step: torch.Tensor  # [T, R] bool: read from the step's rows
    step_row: torch.Tensor  # [T, R] long: that row of the step (clamped where not in_step)
    ring_row: torch.Tensor  # [T, R] long: slot * R + pos % R in the ring viewed as [slots * R, C]
    valid: torch.Tensor  # [T, R] bool: position >= 0
    write_row: torch.Tensor  # [T] long: where the token's own row is stored; its chunk's newest R rows
    # land at slot * R + pos % R, older rows of the chunk (a later token overwrites them) and padding
    # in the trash slot

    def tokens(self, s: int, e: int) -> "RingIndex":
        return RingIndex(*(t[s:e] for t in self))


class BlockIndex(NamedTuple):
    """Each token's compressed block for a compress ratio r."""

    phase: torch.Tensor  # [T] pos % r (the compressor's positional bias row)
    block: torch.Tensor  # [T] pos // r
    emit_slot: torch.Tensor  # [T] the token's slot if it completes its block, else the trash slot
    n_done: torch.Tensor  # [T] (pos + 1) // r: completed entries the token may attend to
    cis: torch.Tensor  # [T, Dr/2] complex64 (complex128 in a float64 run): rotary at the entry's position block * r


@dataclass
class StepIndex:
    rings: dict[int, RingIndex]  # by ring length R
    cis: dict[str, torch.Tensor]  # by rotary kind ("window", "compressed"): [T, Dr/2] at pos
    blocks: dict[int, BlockIndex]  # by compress ratio

    def tensors(self) -> list[torch.Tensor]:
        return ([t for ix in self.rings.values() for t in ix] + list(self.cis.values())
                + [t for ix in self.blocks.values() for t in ix])

    def rows(self, n: int) -> "StepIndex":
        """The first n tokens' index (views)."""
        return StepIndex({r: ix.tokens(0, n) for r, ix in self.rings.items()},
                         {k: c[:n] for k, c in self.cis.items()},
                         {r: BlockIndex(*(t[:n] for t in ix)) for r, ix in self.blocks.items()})
