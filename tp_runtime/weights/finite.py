"""Non-finite weights refused where they load: one reduction per tensor on its device, one sync.

    check = FiniteCheck()
    check.add(name, origin, tensor)   # queues torch.aminmax(tensor) on the tensor's device: no sync
    check.raise_if_any()              # one host transfer for all tensors; CheckpointError naming the
                                      # first tensor holding NaN or inf and where it came from

min and max of a tensor are finite exactly when every element is (both propagate NaN, +inf shows
in the max, -inf in the min), so one fused pass over each tensor decides it. The check runs on the
values as placed, in the run dtype: after FP8 dequantization (an e4m3 NaN byte 0x7F / 0xFF, or a
scale that overflows the product) and after any rounding to a narrower dtype.
"""

from __future__ import annotations

import torch

from tp_runtime.weights.format import CheckpointError


class FiniteCheck:
    def __init__(self) -> None:
        self._where: list[tuple[str, str]] = []  # (tensor name, origin) per queued tensor
        self._extrema: list[torch.Tensor] = []  # [2] (min, max) per queued tensor, on its device

    def add(self, name: str, origin: str, t: torch.Tensor) -> None:
        """Queue one tensor (no host sync); `origin` says where it came from (a file, the seeded draw)."""
        if t.numel():
            self._where.append((name, origin))
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no aminmax kernel: widen (NaN stays NaN)
                t = t.float()
            self._extrema.append(torch.stack(torch.aminmax(t)).double())

    def raise_if_any(self) -> None:
        """CheckpointError naming the first queued tensor that holds NaN or inf, and how many do."""
        if not self._extrema:
            return
        by_device: dict[torch.device, list[int]] = {}
        for i, e in enumerate(self._extrema):
            by_device.setdefault(e.device, []).append(i)
        extrema = torch.empty(len(self._extrema), 2, dtype=torch.float64)
        for idx in by_device.values():  # one transfer per device (one in practice)
            extrema[idx] = torch.stack([self._extrema[i] for i in idx]).cpu()
        bad = (~torch.isfinite(extrema).all(dim=1)).nonzero().flatten().tolist()
        if bad:
            (name, origin), (lo, hi) = self._where[bad[0]], extrema[bad[0]].tolist()
            more = f"; {len(bad) - 1} more tensor(s) too" if len(bad) > 1 else ""
            raise CheckpointError(f"tensor {name} from {origin} holds non-finite values (min {lo}, max {hi}: "
                                  f"NaN or inf) after loading{more}")
