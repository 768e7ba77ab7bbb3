"""RMSNorm of rows in one launch (Triton): y = w * x * rsqrt(mean(x^2) + eps), fp32 math, x's dtype out.

Same rounding as `model.layers.rms_norm`: x read into fp32, the normed row times the weight in fp32,
one cast at the end. One program per row (grid (T,)); the row is one register tile of
next_power_of_2(C) elements. No host reads and a fixed configuration per C: capturable in a CUDA graph.

PDL (ops/kernel_support.py): the wait precedes the row's load (x is the previous kernel's output), the
trigger follows the weight's load, before the normed row is stored.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton


@jit
def _rms_norm_kernel(x_ptr, sx_t, w_ptr, y_ptr, sy_t, eps, C: tl.constexpr, HAS_W: tl.constexpr,
                     BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    cm = c < C
    pdl_wait(PDL)
    x = tl.load(x_ptr + t * sx_t + c, mask=cm, other=0.0).to(tl.float32)  # [BLOCK_C]
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / C + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
    pdl_trigger(PDL)
    tl.store(y_ptr + t * sy_t + c, y.to(y_ptr.dtype.element_ty), mask=cm)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, pdl: bool = False) -> torch.Tensor:
    """x [T, C] (last dim contiguous, any row stride), weight [C] or None -> y [T, C] contiguous, x's dtype.
    pdl: launch with programmatic dependent launch (resolve_pdl; bitwise the same output)."""
    T, C = x.shape
    assert x.stride(1) == 1 and (weight is None or (weight.shape == (C,) and weight.stride(0) == 1))
    y = torch.empty(T, C, dtype=x.dtype, device=x.device)
    if T == 0:
        return y
    block = triton.next_power_of_2(C)
    # 16 fp32 elements per thread from C = 2048 up (8 warps at 4096, 16 at Pro's 7168 -> 8192); 4 warps below
    warps = min(16, max(4, block // 512))
    _rms_norm_kernel[(T,)](x, x.stride(0), weight if weight is not None else x, y, y.stride(0), eps,
                           C=C, HAS_W=weight is not None, BLOCK_C=block, PDL=pdl, num_warps=warps,
                           launch_pdl=pdl)
    return y
