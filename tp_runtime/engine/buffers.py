"""StepBuffers: the static device buffers a step runs on, filled from a StepPlan before it runs or replays.

Allocated once at the largest step size and never reallocated: a CUDA graph captured on them replays
on later steps' contents.
"""

from __future__ import annotations

import torch

from tp_runtime.engine.plan import StepPlan
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.step_index import IndexPlan


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
