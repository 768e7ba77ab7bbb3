"""One step's work: a plan of sequence chunks (host) and its flat token batch (static device buffers).

A step holds T tokens from many sequences, prefill chunks and decode tokens mixed; each sequence's
tokens are contiguous and in position order. The plan is what the driver decides and broadcasts;
the batch is what the layers read. Buffers are allocated once at the largest step size and never
reallocated (a CUDA graph captured on them replays on later steps' contents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.step_index import IndexPlan, StepIndex


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

    # Wire format for the driver's broadcast: [n_chunks, then 5 ints per chunk], fixed capacity.
    FIELDS = 5

    def encode(self, capacity: int) -> torch.Tensor:
        if len(self.chunks) > capacity:
            raise ValueError(f"plan has {len(self.chunks)} chunks, capacity {capacity}")
        t = torch.zeros(1 + self.FIELDS * capacity, dtype=torch.long)
        t[0] = len(self.chunks)
        for i, c in enumerate(self.chunks):
            t[1 + i * self.FIELDS: 1 + (i + 1) * self.FIELDS] = torch.tensor(
                [c.request, c.slot, c.start, c.length, int(c.decode)])
        return t

    @classmethod
    def decode_wire(cls, t: torch.Tensor) -> "StepPlan":
        n = int(t[0])
        rows = t[1: 1 + cls.FIELDS * n].view(n, cls.FIELDS).tolist()
        return cls(tuple(SeqChunk(r, s, st, ln, bool(d)) for r, s, st, ln, d in rows))


@dataclass
class StepBatch:
    """Views [n_padded] of the static buffers; tokens past n_tokens are padding.

    Padding tokens carry the trash slot (one spare row at the end of every cache), so device code
    may process all n_padded tokens without a host-side mask: padding reads and writes only trash.
    Captured code reads only the tensors; the host ints are for eager code.
    """

    x: torch.Tensor  # [T, hidden] input hidden states
    slot: torch.Tensor  # [T] cache slot of each token's sequence (trash slot for padding)
    pos: torch.Tensor  # [T] absolute position
    start_idx: torch.Tensor  # [T] flat index of the first token of this token's chunk
    start_pos: torch.Tensor  # [T] position of that first token
    last_pos: torch.Tensor  # [T] position of the chunk's last token
    n_tokens: int  # real tokens (host); the step runs with len(pos) (a capture size, or n_tokens)
    max_pos: int  # largest position in the step (host); bounds compressed candidate sets
    ix: StepIndex  # rows, positions and rotary angles derived from the metadata (step_index.py)


class StepBuffers:
    """Static device buffers for up to `capacity` tokens; `load` fills them for one plan."""

    def __init__(self, capacity: int, hidden: int, dtype: torch.dtype, device: torch.device, trash_slot: int,
                 plan: IndexPlan):
        self.capacity, self.trash_slot, self.plan = capacity, trash_slot, plan
        self.x = torch.zeros(capacity, hidden, dtype=dtype, device=device)
        # Metadata rows: slot, pos, start_idx, start_pos, last_pos.
        self.meta = torch.zeros(5, capacity, dtype=torch.long, device=device)
        self._host = torch.zeros(5, capacity, dtype=torch.long, pin_memory=device.type == "cuda")
        # The host rows are copied asynchronously; this event says when they may be rewritten.
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self.index = plan.compute(*self.meta, trash=trash_slot)  # static: recomputed in place each step

    def load(self, plan: StepPlan, x: torch.Tensor, n_padded: int) -> StepBatch:
        """Copy one step's inputs x [T, hidden] and metadata in; pad to n_padded tokens."""
        n = plan.n_tokens
        if not n <= n_padded <= self.capacity:
            raise ValueError(f"step of {n} tokens padded to {n_padded} exceeds buffer capacity {self.capacity}")
        if x.shape != (n, self.x.shape[1]):
            raise ValueError(f"step input has shape {tuple(x.shape)}, expected ({n}, {self.x.shape[1]})")
        h = self._host
        if self._copied is not None:
            self._copied.synchronize()
        h[:, :n_padded] = 0
        h[0, :n_padded] = self.trash_slot
        i = 0
        for c in plan.chunks:
            j = i + c.length
            h[0, i:j] = c.slot
            h[1, i:j] = torch.arange(c.start, c.start + c.length)
            h[2, i:j], h[3, i:j], h[4, i:j] = i, c.start, c.start + c.length - 1
            i = j
        self.meta[:, :n_padded].copy_(h[:, :n_padded], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.index.assign(self.plan.compute(*self.meta[:, :n_padded], trash=self.trash_slot))
        self.x[:n].copy_(x)
        self.x[n:n_padded].zero_()
        max_pos = max((c.start + c.length - 1 for c in plan.chunks), default=0)
        return self.view(n_padded, n, max_pos)

    def view(self, n_padded: int, n_tokens: int, max_pos: int) -> StepBatch:
        """The batch over the first n_padded rows as they stand (no copies: safe inside a capture)."""
        m = self.meta
        return StepBatch(self.x[:n_padded], m[0, :n_padded], m[1, :n_padded], m[2, :n_padded],
                         m[3, :n_padded], m[4, :n_padded], n_tokens, max_pos, self.index.rows(n_padded))


class LiveBatch:
    """Holder of the step being run. Eager breaks read `live.batch` when they run, so a replayed
    graph's eager calls see the current step's metadata rather than the one seen at capture."""

    def __init__(self) -> None:
        self.batch: StepBatch | None = None
