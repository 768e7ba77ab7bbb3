"""Tensor-parallel building blocks: replicated, column-parallel and row-parallel linears, RMSNorm.

Each parallel class holds only its rank's shard, allocated empty; `weights/fill.py` fills it (seeded draw
or checkpoint). The row-parallel linear owns the layer's single all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tp_runtime.parallel.group import TPGroup


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """y = w * x * rsqrt(mean(x^2) + eps) over the last dim, in fp32; returns x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class ReplicatedLinear(nn.Module):
    """y = x @ W^T with the whole W [out, in] on every rank."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class ColumnParallelLinear(ReplicatedLinear):
    """Output features split across ranks: rank k holds rows [k*out/tp, (k+1)*out/tp) of W."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device):
        lo, hi = tp.shard(out_features, "output features")
        super().__init__(in_features, hi - lo, dtype, device)


class RowParallelLinear(nn.Module):
    """Input features split across ranks; partial products summed by one all-reduce over the group."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        lo, hi = tp.shard(in_features, "input features")
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, hi - lo, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in/tp] local slice -> partial [T, out] -> summed over ranks.
        return self.tp.all_reduce(F.linear(x, self.weight))
