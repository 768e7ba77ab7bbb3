"""Tensor-parallel building blocks: replicated, column-parallel and row-parallel linears, RMSNorm.

Each parallel class holds only its rank's shard, allocated empty; `weights/fill.py` fills it (seeded draw
or checkpoint). The row-parallel linear owns the layer's single all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tp_runtime.ops.linear import fp8_linear
from tp_runtime.ops.rms_norm import rms_norm as triton_rms_norm
from tp_runtime.parallel.group import TPGroup


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """y = w * x * rsqrt(mean(x^2) + eps) over the last dim, in fp32; returns x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    """kernels: 'torch' (rms_norm above, any shape) or 'triton' (ops/rms_norm.py: x [T, C] with the last
    dim contiguous, one launch, the same rounding)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device, kernels: str = "torch"):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device), requires_grad=False)
        self._norm = triton_rms_norm if kernels == "triton" else rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, self.weight, self.eps)


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class Linear(nn.Module):
    """y = x @ W^T for this rank's W [out, in]: `weight` in the run dtype, or (fp8) `qweight`
    float8_e4m3fn [out, in] with `scale`, one e8m0 byte per 128 x 128 block [ceil(out/128), ceil(in/128)].
    round_x (FP8, set by the stack): GEMMs of more than 32 rows may round x to e4m3 (ops/linear.py)."""

    round_x: bool = False

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
                 fp8: bool = False):
        super().__init__()
        self.fp8 = fp8
        if fp8:
            self.qweight = _frozen(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device=device))
            self.scale = _frozen(torch.empty(-(-out_features // 128), -(-in_features // 128), dtype=torch.uint8,
                                             device=device))
        else:
            self.weight = _frozen(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.qweight, self.scale, round_x=self.round_x) if self.fp8 else F.linear(x, self.weight)


class ReplicatedLinear(Linear):
    """The whole W [out, in] on every rank."""


class ColumnParallelLinear(Linear):
    """Output features split across ranks: rank k holds rows [k*out/tp, (k+1)*out/tp) of W."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device, fp8: bool = False):
        lo, hi = tp.shard(out_features, "output features")
        super().__init__(in_features, hi - lo, dtype, device, fp8)


class RowParallelLinear(Linear):
    """Input features split across ranks; partial products summed by one all-reduce over the group."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device, fp8: bool = False):
        lo, hi = tp.shard(in_features, "input features")
        super().__init__(hi - lo, out_features, dtype, device, fp8)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in/tp] local slice -> partial [T, out] -> summed over ranks.
        return self.tp.all_reduce(super().forward(x))
