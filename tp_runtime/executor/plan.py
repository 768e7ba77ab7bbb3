"""StepPlan: one step's work as the driver decides and broadcasts it, a tuple of sequence chunks (host).

A step holds T tokens from many sequences, prefill chunks and decode tokens mixed; each sequence's
tokens are contiguous and in position order. Every rank receives the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqChunk:
    request: int  # request id
    slot: int  # cache slot the sequence lives in
    start: int  # position of the chunk's first token
    length: int  # tokens of this sequence in this step
    decode: bool  # a decode token (past the prompt) rather than a prefill chunk


@dataclass(frozen=True)
class StepPlan:
    chunks: tuple[SeqChunk, ...]

    @property
    def n_tokens(self) -> int:
        return sum(c.length for c in self.chunks)

    @property
    def decode_only(self) -> bool:
        return bool(self.chunks) and all(c.decode for c in self.chunks)

    # Wire format inside the driver's broadcast (executor/message.py): [n_chunks, then 5 ints per chunk], fixed
    # capacity.
    FIELDS = 5

    def encode(self, capacity: int) -> torch.Tensor:
        return torch.tensor(self.wire_list(capacity), dtype=torch.long)

    def wire_list(self, capacity: int) -> list[int]:
        """The wire as one list (then one tensor: no tensor op per chunk)."""
        if len(self.chunks) > capacity:
            raise ValueError(f"plan has {len(self.chunks)} chunks, capacity {capacity}")
        wire = [len(self.chunks)]
        for c in self.chunks:
            wire += (c.request, c.slot, c.start, c.length, int(c.decode))
        return wire + [0] * (self.FIELDS * (capacity - len(self.chunks)))

    @classmethod
    def decode_wire(cls, t: torch.Tensor) -> "StepPlan":
        n = int(t[0])
        rows = t[1: 1 + cls.FIELDS * n].view(n, cls.FIELDS).tolist()
        return cls(tuple(SeqChunk(r, s, st, ln, bool(d)) for r, s, st, ln, d in rows))
