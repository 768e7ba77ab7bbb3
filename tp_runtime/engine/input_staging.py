"""How a step's input rows [T, hidden] reach the device without the host waiting on the GPU.

    seeded   each token's stream key (seed, request, position; `weights.seeded.token_keys`) is hashed on
             the host, T int64 values; they go through a pinned ring (`executor.staging.HostRing`) copied
             non_blocking, and the rows are drawn on the device from the keys and the channels' counters
             (made once per device): the rows `token_rows` gives, bit for bit
    file     the step's rows are concatenated straight into a pinned buffer of the ring, cast to the run
             dtype on the way (as `.to(dtype)` casts them), and copied non_blocking

On a CPU there is no ring: the same values are made in place. Every call returns a new device tensor, so
a caller may hold the inputs of several steps (the bench makes them all before timing).
"""

from __future__ import annotations

import torch

from tp_runtime.executor.plan import StepPlan
from tp_runtime.executor.staging import HostRing
from tp_runtime.weights.seeded import counters, normal_of_counters, token_keys


class InputStaging:
    """One device's input path: its ring of pinned buffers (CUDA) and the hidden channels' counters."""

    def __init__(self, device: torch.device, hidden: int, ring: HostRing | None = None):
        """ring: None takes the device's (`HostRing.for_device`: pinned buffers on CUDA, none on a CPU)."""
        self.device, self.hidden = device, hidden
        self.ring = ring if ring is not None else HostRing.for_device(device)
        # normal(key, channel)'s key-independent half, [1, hidden] each: computed once, not every step.
        self._counters = counters(torch.arange(hidden, dtype=torch.long, device=device)[None])

    @property
    def wait_s(self) -> float:
        """Seconds the host spent waiting for a pinned buffer (it was the ring's depth of steps ahead)."""
        return self.ring.wait_s if self.ring is not None else 0.0

    def seeded(self, seed: int, plan: StepPlan, dtype: torch.dtype) -> torch.Tensor:
        """Seeded rows [T, hidden] of the plan's tokens, in its token order, in `dtype`."""
        request, pos = plan_tokens(plan)
        keys = token_keys(seed, request, pos)  # [T] int64, host
        if self.ring is not None:
            keys = self.ring.upload(keys, torch.empty_like(keys, device=self.device))
        return normal_of_counters(keys[:, None], *self._counters).to(dtype)

    def rows(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Host row blocks [L_i, hidden] (a file's, float32) stacked into [sum L_i, hidden] on the device."""
        if self.ring is None:
            return torch.cat(parts).to(device=self.device, dtype=dtype)
        buf = self.ring.take((sum(p.shape[0] for p in parts), self.hidden), dtype)
        torch.cat(parts, out=buf)  # casts into the pinned rows: the rounding `.to(dtype)` does on the host
        return self.ring.send(buf, torch.empty(buf.shape, dtype=dtype, device=self.device))


def plan_tokens(plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of a plan, in its order: request id and position, int64 [T] each (host; built as lists,
    one tensor each rather than two small ones per chunk)."""
    request: list[int] = []
    pos: list[int] = []
    for c in plan.chunks:
        request += [c.request] * c.length
        pos += range(c.start, c.start + c.length)
    return torch.tensor(request, dtype=torch.long), torch.tensor(pos, dtype=torch.long)
