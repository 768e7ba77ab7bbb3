"""Tensor-parallel building blocks: replicated, column-parallel and row-parallel linears, RMSNorm.

Each parallel class holds only its rank's shard, allocated empty; `weights/fill.py` fills it (seeded draw
or checkpoint). The row-parallel linear owns the layer's single all-reduce. Kernels come from the stack's
kernel backend (`ops/select.py`): the norm and the FP8 GEMMs call its methods.
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.ops.act_quant import RoundedX
from tp_runtime.ops.select import KernelBackend
from tp_runtime.parallel.group import TPGroup


class RMSNorm(nn.Module):
    """y = weight * x * rsqrt(mean(x^2) + eps) over x [T, C], by the backend's rms_norm."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device, backend: KernelBackend):
        super().__init__()
        self.eps, self.backend = eps, backend
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, self.weight, self.eps)


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class Linear(nn.Module):
    """y = x @ W^T for this rank's W [out, in]: `weight` in the run dtype, or (fp8) `qweight`
    float8_e4m3fn [out, in] with `scale`, one e8m0 byte per 128 x 128 block [ceil(out/128), ceil(in/128)].
    round_x (FP8, set by the stack): the GEMM rounds x to e4m3 per 1 x 128 block first, as released (ops/fp8_gemm.py).
    FP8 weights multiply through the backend's fp8_linear; weights in the run dtype through its linear (cuBLAS, or
    the Triton GEMV at the shapes where it was measured faster: ops/gemv.py)."""

    round_x: bool = False

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
                 backend: KernelBackend, fp8: bool = False):
        super().__init__()
        self.fp8, self.backend = fp8, backend
        if fp8:
            self.qweight = _frozen(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device=device))
            self.scale = _frozen(torch.empty(-(-out_features // 128), -(-in_features // 128), dtype=torch.uint8,
                                             device=device))
        else:
            self.weight = _frozen(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, norm: RMSNorm | None = None, rounded: RoundedX | None = None) -> torch.Tensor:
        """x [T, in] -> [T, out]; norm: x is taken through it first (as the GEMV's prologue where the backend
        fuses it: bf16 weights only); rounded: x rounded to e4m3 ahead by its producer (FP8 with round_x only)."""
        if self.fp8:
            x = norm(x) if norm is not None else x
            return self.backend.fp8_linear(x, self.qweight, self.scale, round_x=self.round_x,
                                           rounded=rounded if self.round_x else None)
        if norm is None:
            return self.backend.linear(x, self.weight)
        return self.backend.linear(x, self.weight, norm.weight, norm.eps)


class ReplicatedLinear(Linear):
    """The whole W [out, in] on every rank."""


class ColumnParallelLinear(Linear):
    """Output features split across ranks: rank k holds rows [k*out/tp, (k+1)*out/tp) of W."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device, backend: KernelBackend, fp8: bool = False):
        lo, hi = tp.shard(out_features, "output features")
        super().__init__(in_features, hi - lo, dtype, device, backend, fp8)


class RowParallelLinear(Linear):
    """Input features split across ranks; partial products summed by one all-reduce over the group."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, dtype: torch.dtype,
                 device: torch.device, backend: KernelBackend, fp8: bool = False):
        lo, hi = tp.shard(in_features, "input features")
        super().__init__(hi - lo, out_features, dtype, device, backend, fp8)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in/tp] local slice -> partial [T, out] -> summed over ranks.
        return self.tp.all_reduce(super().forward(x))
