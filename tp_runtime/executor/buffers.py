"""StepBuffers: the static device buffers a step runs on, filled from a StepPlan before it runs or replays.

Allocated once at the largest step size and never reallocated: a CUDA graph captured on them replays
on later steps' contents.
"""

from __future__ import annotations

import torch

from tp_runtime.executor.plan import StepPlan
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.step_index import IndexPlan
from tp_runtime.ops.select import KernelBackend


class StepBuffers:
    """Static device buffers for up to `capacity` tokens; `load` fills them for one plan."""

    def __init__(self, capacity: int, hidden: int, dtype: torch.dtype, device: torch.device, trash_slot: int,
                 plan: IndexPlan, backend: KernelBackend):
        self.capacity, self.trash_slot, self.plan, self.backend = capacity, trash_slot, plan, backend
        self.x = torch.zeros(capacity, hidden, dtype=dtype, device=device)
        # Metadata rows: slot, pos, start_idx, start_pos, last_pos.
        self.meta = torch.zeros(5, capacity, dtype=torch.long, device=device)
        self._host = torch.zeros(5, capacity, dtype=torch.long, pin_memory=device.type == "cuda")
        # The host rows are copied asynchronously; this event says when they may be rewritten.
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self.index = plan.compute(*self.meta, trash=trash_slot)  # static: recomputed in place each step

    def load(self, plan: StepPlan, x: torch.Tensor, n_padded: int, index: bool = True) -> StepBatch:
        """Copy one step's inputs x [T, hidden] and metadata in; pad to n_padded tokens.

        index=False leaves the step index to the caller: a full graph computes it from the metadata
        buffers inside the graph (`compute_index`), so a replayed step costs only these copies.
        """
        n = plan.n_tokens
        if not n <= n_padded <= self.capacity:
            raise ValueError(f"step of {n} tokens padded to {n_padded} exceeds buffer capacity {self.capacity}")
        if x.shape != (n, self.x.shape[1]):
            raise ValueError(f"step input has shape {tuple(x.shape)}, expected ({n}, {self.x.shape[1]})")
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has left the pinned rows
        self._host[:, :n_padded] = self._host_rows(plan, n_padded)
        self.meta[:, :n_padded].copy_(self._host[:, :n_padded], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if index:
            self.compute_index(n_padded)
        self.x[:n].copy_(x)
        self.x[n:n_padded].zero_()
        max_pos = max((c.start + c.length - 1 for c in plan.chunks), default=0)
        return self.view(n_padded, n, max_pos)

    def _host_rows(self, plan: StepPlan, n_padded: int) -> torch.Tensor:
        """Metadata rows [5, n_padded] of a plan, built as Python lists (one tensor, not 5 ops per chunk);
        padding tokens: trash slot, position 0, a chunk of their own."""
        rows: list[list[int]] = [[], [], [], [], []]
        i = 0
        for c in plan.chunks:
            rows[0] += [c.slot] * c.length
            rows[1] += range(c.start, c.start + c.length)
            rows[2] += [i] * c.length
            rows[3] += [c.start] * c.length
            rows[4] += [c.start + c.length - 1] * c.length
            i += c.length
        pad = n_padded - i
        for r, v in zip(rows, (self.trash_slot, 0, 0, 0, 0)):
            r += [v] * pad
        return torch.tensor(rows, dtype=torch.long)

    def compute_index(self, n_padded: int) -> None:
        """The step index of the first n_padded tokens, from the metadata buffers into the static index
        (device work only: capturable; one launch on the Triton backend)."""
        self.plan.compute_into(self.index, *self.meta[:, :n_padded], trash=self.trash_slot, backend=self.backend)

    def view(self, n_padded: int, n_tokens: int, max_pos: int) -> StepBatch:
        """The batch over the first n_padded rows as they stand (no copies: safe inside a capture)."""
        m = self.meta
        return StepBatch(self.x[:n_padded], m[0, :n_padded], m[1, :n_padded], m[2, :n_padded],
                         m[3, :n_padded], m[4, :n_padded], n_tokens, max_pos, self.index.rows(n_padded))
