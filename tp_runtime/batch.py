"""One step's work: a plan of sequence chunks (host) and its flat token batch (static device buffers).

A step holds T tokens from many sequences, prefill chunks and decode tokens mixed; each sequence's
tokens are contiguous and in position order. The plan is what the driver decides and broadcasts;
the batch is what the layers read. Buffers are allocated once at the largest step size and never
reallocated (a CUDA graph captured on them replays on later steps' contents).
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
    """Views [n_padded] of the static buffers; tokens past n_tokens are padding (slot -1).

    `lists` holds token-index lists the host derives from the plan, so stage B never asks the
    device which tokens qualify (a `nonzero` would stall the host on the GPU every layer):
    ("done", r): tokens that complete an r-token block; ("newest", R): the newest R tokens of
    each chunk (the ones a ring of R rows keeps).
    """

    x: torch.Tensor  # [T, hidden] input hidden states
    slot: torch.Tensor  # [T] cache slot of each token's sequence
    pos: torch.Tensor  # [T] absolute position
    start_idx: torch.Tensor  # [T] flat index of the first token of this token's chunk
    start_pos: torch.Tensor  # [T] position of that first token
    n_tokens: int  # real tokens (host)
    n_padded: int  # tokens the step runs with (a capture size, or n_tokens when eager)
    max_pos: int  # largest position in the step (host); bounds compressed candidate sets
    lists: dict[tuple[str, int], torch.Tensor]  # name -> [count] token indices


def _token_lists(plan: StepPlan, keys: list[tuple[str, int]]) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {k: [] for k in keys}
    i = 0
    for c in plan.chunks:
        for kind, r in keys:
            if kind == "done":  # positions p with (p + 1) % r == 0
                first = c.start + (-(c.start + 1)) % r
                out[(kind, r)] += [i + p - c.start for p in range(first, c.start + c.length, r)]
            else:
                out[(kind, r)] += list(range(i + max(0, c.length - r), i + c.length))
        i += c.length
    return out


class StepBuffers:
    """Static device buffers for up to `capacity` tokens; `load` fills them for one plan."""

    ROWS = 4  # slot, pos, start_idx, start_pos

    def __init__(self, capacity: int, hidden: int, dtype: torch.dtype, device: torch.device,
                 list_keys: list[tuple[str, int]] = ()):
        self.capacity, self.list_keys = capacity, list(list_keys)
        self.x = torch.zeros(capacity, hidden, dtype=dtype, device=device)
        rows = self.ROWS + len(self.list_keys)
        self.meta = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self._host = torch.zeros(rows, capacity, dtype=torch.long, pin_memory=device.type == "cuda")
        # The host rows are copied asynchronously; this event says when they may be rewritten.
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self._counts = {k: 0 for k in self.list_keys}

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
        h[0, :n_padded] = -1
        i = 0
        for c in plan.chunks:
            j = i + c.length
            h[0, i:j] = c.slot
            h[1, i:j] = torch.arange(c.start, c.start + c.length)
            h[2, i:j], h[3, i:j] = i, c.start
            i = j
        for row, (key, idx) in enumerate(_token_lists(plan, self.list_keys).items(), start=self.ROWS):
            h[row, : len(idx)] = torch.tensor(idx, dtype=torch.long)
            self._counts[key] = len(idx)
        self.meta[:, :n_padded].copy_(h[:, :n_padded], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.x[:n].copy_(x)
        self.x[n:n_padded].zero_()
        max_pos = max((c.start + c.length - 1 for c in plan.chunks), default=0)
        return self.view(n_padded, n, max_pos)

    def view(self, n_padded: int, n_tokens: int, max_pos: int) -> StepBatch:
        """The batch over the first n_padded rows as they stand (no copies: safe inside a capture)."""
        m = self.meta
        counts = self._counts if n_tokens else {k: 0 for k in self.list_keys}
        lists = {k: m[self.ROWS + r, : counts[k]] for r, k in enumerate(self.list_keys)}
        return StepBatch(self.x[:n_padded], m[0, :n_padded], m[1, :n_padded], m[2, :n_padded],
                         m[3, :n_padded], n_tokens, n_padded, max_pos, lists)


class LiveBatch:
    """Holder of the step being run. Eager breaks read `live.batch` when they run, so a replayed
    graph's eager calls see the current step's metadata rather than the one seen at capture."""

    def __init__(self) -> None:
        self.batch: StepBatch | None = None
