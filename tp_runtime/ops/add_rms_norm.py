"""The residual add fused with the next layer's pre-norm (Triton): one launch writes both

    h_new = h + y                                   (h's dtype: fp32 sum, one rounding, as torch's `h + y`)
    x     = w * h_new * rsqrt(mean(h_new^2) + eps)  (fp32 math on the rounded h_new, one cast)

One program per row (grid (T,)), the row one register tile of next_power_of_2(C) elements, the norm's
warp count and expression those of `ops/rms_norm.py` (`normalize_row`, `norm_warps`). So h_new is bitwise
torch's `h + y`, and x is bitwise `ops.rms_norm.rms_norm(h + y, w, eps)` wherever the two kernels compile to
the same layout (rows of h and y with row strides that are multiples of 16 elements, as the model's
contiguous [T, hidden] tensors are); against the torch RMSNorm (model/layers.py) x differs by the order of
the fp32 sum of squares only, the tolerance the RMSNorm kernel is tested to (tests/test_prep_kernels_gpu.py).
No host reads and a fixed configuration per C: capturable in a CUDA graph.

PDL (`pdl=True`): programmatic dependent launch; `gdc_wait` before the loads of h and y (the previous
kernels' outputs), `gdc_launch_dependents` after the row's last load.

`add_rms_norm_rounded` also rounds x to e4m3 per 1 x 128 block for the next layer's FP8 GEMM of x (ops/act_quant.py's
RoundedX), from x as stored: bit for bit a `quantize_x` launch on x, without that launch or its pass over x. Its
grid covers RoundedX's padded rows (rows t >= T round a zero row, as `quantize_x` pads).
"""

from __future__ import annotations

import torch

from tp_runtime.ops.act_quant import RoundedX, rounded_x_buffers, store_rounded_row
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton
from tp_runtime.ops.rms_norm_pair import norm_warps, normalize_row


@jit
def _add_rms_norm_kernel(h_ptr, sh_t, y_ptr, sy_t, w_ptr, ho_ptr, sho_t, x_ptr, sx_t, q_ptr, sq_ptr, T, MP, eps,
                         C: tl.constexpr, BLOCK_C: tl.constexpr, ROUND: tl.constexpr, PDL: tl.constexpr):
    # Grid (T,), or (MP,) with ROUND: rows t >= T (RoundedX's padding) read and write nothing but their rounding.
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    cm = (c < C) & (t < T)
    pdl_wait(PDL)
    h = tl.load(h_ptr + t * sh_t + c, mask=cm, other=0.0)  # [BLOCK_C]
    y = tl.load(y_ptr + t * sy_t + c, mask=cm, other=0.0)
    w = tl.load(w_ptr + c, mask=c < C, other=0.0)
    pdl_trigger(PDL)
    s = (h.to(tl.float32) + y.to(tl.float32)).to(ho_ptr.dtype.element_ty)  # torch's h + y: one rounding
    tl.store(ho_ptr + t * sho_t + c, s, mask=cm)
    x = normalize_row(s.to(tl.float32), w, C, eps).to(x_ptr.dtype.element_ty)
    tl.store(x_ptr + t * sx_t + c, x, mask=cm)
    if ROUND:
        store_rounded_row(x.to(tl.float32), q_ptr, sq_ptr, t, C, MP, BLOCK_C)


def _fits(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    return t.shape == shape and t.dtype == dtype and t.stride(-1) == 1


def add_rms_norm(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 h_out: torch.Tensor | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, C] (the residual stream), y [T, C] (a layer's output, h's dtype), weight [C] -> (h_new, x),
    both [T, C] in h's dtype: h_new = h + y and x = RMSNorm(h_new) * weight, in one launch.

    Rows of h and y may have any row stride (last dim contiguous). h_out: where h_new goes ([T, C], h's
    dtype, last dim contiguous; h itself is allowed: each program reads its row before writing it); a new
    contiguous tensor if None. x is a new contiguous tensor. pdl: launch with programmatic dependent launch.
    """
    h_new, x, _ = _launch(h, y, weight, eps, h_out, pdl, False)
    return h_new, x


def add_rms_norm_rounded(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, *,
                         h_out: torch.Tensor | None = None, pdl: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
    """`add_rms_norm`, and x rounded to e4m3 per 1 x 128 block for the FP8 GEMM that reads it (module doc), in the
    same launch. C of at least 65 (a row tile of at least one 128-wide block)."""
    if triton.next_power_of_2(h.shape[-1]) < 128:
        raise ValueError(f"add_rms_norm_rounded: rows of {h.shape[-1]}, fewer than one 128-wide block's tile")
    h_new, x, rx = _launch(h, y, weight, eps, h_out, pdl, True)
    return h_new, x, rx


def _launch(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, h_out: torch.Tensor | None,
            pdl: bool, round_x: bool) -> tuple[torch.Tensor, torch.Tensor, RoundedX | None]:
    T, C = h.shape
    if not (_fits(h, (T, C), h.dtype) and _fits(y, (T, C), h.dtype) and weight.shape == (C,)
            and weight.stride(0) == 1 and (h_out is None or _fits(h_out, (T, C), h.dtype))):
        raise ValueError(f"add_rms_norm: h {tuple(h.shape)} {h.dtype}, y {tuple(y.shape)} {y.dtype}, weight "
                         f"{tuple(weight.shape)} do not fit: rows [T, C] of one dtype, last dims contiguous")
    h_new = torch.empty(T, C, dtype=h.dtype, device=h.device) if h_out is None else h_out
    x = torch.empty(T, C, dtype=h.dtype, device=h.device)
    rx = rounded_x_buffers(T, C, h.device) if round_x else None
    if T == 0:
        return h_new, x, rx
    rows = rx.q.shape[0] if rx is not None else T
    q, s = (rx.q, rx.s) if rx is not None else (x, x)  # (not read without ROUND)
    block = triton.next_power_of_2(C)
    _add_rms_norm_kernel[(rows,)](h, h.stride(0), y, y.stride(0), weight, h_new, h_new.stride(0), x, x.stride(0), q,
                                  s, T, rows, eps, C=C, BLOCK_C=block, ROUND=round_x, PDL=pdl,
                                  num_warps=norm_warps(block), launch_pdl=pdl)
    return h_new, x, rx
