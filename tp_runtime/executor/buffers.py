"""StepBuffers: the static device buffers a step runs on, filled from a StepPlan before it runs or replays.

Allocated once at the largest step size and never reallocated: a CUDA graph captured on them replays
on later steps' contents. A step's metadata rows are built on the host and reach the device through a
ring of pinned buffers (`staging.HostRing`) copied without waiting; nothing in `load` waits on the GPU
unless the host is a ring's depth of steps ahead of it.
"""

from __future__ import annotations

import torch

from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.staging import HostRing
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.step_index import IndexPlan
from tp_runtime.ops.select import KernelBackend


class StepBuffers:
    """Static device buffers for up to `capacity` tokens; `load` fills them for one plan."""

    def __init__(self, capacity: int, hidden: int, dtype: torch.dtype, device: torch.device, trash_slot: int,
                 plan: IndexPlan, backend: KernelBackend, ring: HostRing | None = None):
        """backend: the shard's kernels, which compute the step index; ring: the host staging of the metadata
        rows; None takes the device's (`HostRing.for_device`: pinned buffers on CUDA, none on a CPU)."""
        self.capacity, self.trash_slot, self.plan, self.backend = capacity, trash_slot, plan, backend
        self.x = torch.zeros(capacity, hidden, dtype=dtype, device=device)
        # Metadata rows: slot, pos, start_idx, start_pos, last_pos.
        self.meta = torch.zeros(5, capacity, dtype=torch.long, device=device)
        # CUDA: host rows [5, n] go through pinned buffers into one contiguous device row block [5 * capacity]
        # (one copy), then into meta[:, :n] (a strided view: a device-side copy). CPU: copied in directly.
        self._ring = ring if ring is not None else HostRing.for_device(device)
        self._meta_in = torch.zeros(5 * capacity, dtype=torch.long, device=device) if self._ring is not None else None
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
        self._load_meta(self._host_rows(plan, n_padded))
        if index:
            self.compute_index(n_padded)
        self.x[:n].copy_(x)
        self.x[n:n_padded].zero_()
        max_pos = max((c.start + c.length - 1 for c in plan.chunks), default=0)
        return self.view(n_padded, n, max_pos)

    def _load_meta(self, rows: torch.Tensor) -> None:
        """Host metadata rows [5, n] into meta[:, :n], without waiting on the GPU."""
        n = rows.shape[1]
        if self._ring is None:
            self.meta[:, :n].copy_(rows)
            return
        staged = self._meta_in[: 5 * n].view(5, n)
        self._ring.upload(rows, staged)
        self.meta[:, :n].copy_(staged)

    @property
    def host_wait_s(self) -> float:
        """Seconds the host spent waiting for a pinned buffer to be free (it was a ring's depth ahead)."""
        return self._ring.wait_s if self._ring is not None else 0.0

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

    def view(self, n_padded: int, n_tokens: int, max_pos: int, decode: bool = False) -> StepBatch:
        """The batch over the first n_padded rows as they stand (no copies: safe inside a capture); decode:
        every sequence has one token (StepBatch.decode)."""
        m = self.meta
        return StepBatch(self.x[:n_padded], m[0, :n_padded], m[1, :n_padded], m[2, :n_padded],
                         m[3, :n_padded], m[4, :n_padded], n_tokens, max_pos, self.index.rows(n_padded), decode)
