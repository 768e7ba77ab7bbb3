"""Two RMSNorms of different widths in one launch (Triton): a layer's q_norm (Rq wide) and kv_norm (D wide).

    ya = wa * a * rsqrt(mean(a^2) + eps),  yb = wb * b * rsqrt(mean(b^2) + eps)   (eps shared)

Grid (T, 2): program (t, 0) normalizes row t of a, program (t, 1) row t of b, each exactly as
`ops/rms_norm.py`'s kernel does (the same fp32 expression on a register tile of next_power_of_2(C)
elements, one cast), so each output is bitwise that kernel's wherever the two compile to the same layout:
the same tile width and warp count (4 warps for every width up to 2048, which covers DSV4's Rq = 1024 /
1536 and D = 512) and rows of the same alignment. `normalize_row` is the row math shared with
`ops/add_rms_norm.py`. Capturable: no host reads, a fixed configuration per (Ca, Cb).

`rms_norm_pair_rounded` also rounds ya to e4m3 per 1 x 128 block (ops/act_quant.py's RoundedX, what the FP8
GEMMs reading ya take: wq_b and the indexer's wq_b read q_norm's output), from ya as stored (in its dtype), so
bit for bit what a `quantize_x` launch on ya would write, without that launch or its pass over ya. Its grid
covers RoundedX's padded rows: programs (t >= T, 0) round a zero row, as `quantize_x` pads.

PDL (`pdl=True`): launched with programmatic dependent launch; each program waits for its predecessor
(`gdc_wait`) before its first load and lets the next kernel start (`gdc_launch_dependents`) after its last.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.act_quant import RoundedX, rounded_x_buffers, store_rounded_row
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton


@jit
def normalize_row(x, w, C: tl.constexpr, eps):
    """x [BLOCK_C] fp32 (zeros past C), w [BLOCK_C] -> (x * rsqrt(sum(x^2) / C + eps)) * w in fp32: the
    expression of ops/rms_norm.py's kernel, term for term (the same rounding)."""
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / C + eps)
    return y * w.to(tl.float32)


@jit
def _norm_one_row(x_ptr, w_ptr, y_ptr, eps, C: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr, live=True):
    # x_ptr / y_ptr: the row's first element; returns y as stored, in fp32 (zeros past C; a row that is not
    # live, past T, is neither read nor written: zeros). The weight is not a predecessor's output, but it is
    # loaded before the trigger too, so that nothing of this kernel's input traffic overlaps the next kernel.
    c = tl.arange(0, BLOCK_C)
    cm = c < C
    x = tl.load(x_ptr + c, mask=cm & live, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=cm, other=0.0)
    pdl_trigger(PDL)
    y = normalize_row(x, w, C, eps).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + c, y, mask=cm & live)
    return y.to(tl.float32)


@jit
def _rms_norm_pair_kernel(a_ptr, sa_t, wa_ptr, ya_ptr, sya_t, b_ptr, sb_t, wb_ptr, yb_ptr, syb_t, qa_ptr, sqa_ptr,
                          T, MP, eps, CA: tl.constexpr, CB: tl.constexpr, BLOCK_A: tl.constexpr,
                          BLOCK_B: tl.constexpr, ROUND_A: tl.constexpr, PDL: tl.constexpr):
    # Grid (T, 2), or (MP, 2) with ROUND_A: rows t >= T are RoundedX's padding (row b programs do nothing).
    t = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)  # a and b are the previous kernel's output (the x-projection GEMM)
    if tl.program_id(1) == 0:
        ya = _norm_one_row(a_ptr + t * sa_t, wa_ptr, ya_ptr + t * sya_t, eps, CA, BLOCK_A, PDL, t < T)
        if ROUND_A:
            store_rounded_row(ya, qa_ptr, sqa_ptr, t, CA, MP, BLOCK_A)
    elif t < T:
        _norm_one_row(b_ptr + t * sb_t, wb_ptr, yb_ptr + t * syb_t, eps, CB, BLOCK_B, PDL)


def norm_warps(block: int) -> int:
    """ops/rms_norm.py's warp count for a row tile of `block` elements (16 fp32 elements a thread from
    2048 up, 4 warps below, 16 at most); the same count keeps the same reduction order."""
    return min(16, max(4, block // 512))


def _check_rows(x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or w.shape != (x.shape[1],) or w.stride(0) != 1:
        raise ValueError(f"rms_norm_pair: {what} {tuple(x.shape)} (strides {x.stride()}) with weight "
                         f"{tuple(w.shape)} does not fit: rows [T, C] with a contiguous last dim, weight [C]")


def rms_norm_pair(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float, *,
                  pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """a [T, Ca], b [T, Cb] (last dims contiguous, any row strides: column slices of one GEMM output do),
    weights wa [Ca], wb [Cb] -> (ya [T, Ca], yb [T, Cb]) contiguous in a's / b's dtypes: two RMSNorms
    sharing eps, in one launch. pdl: launch with programmatic dependent launch."""
    ya, yb, _ = _launch(a, wa, b, wb, eps, pdl, False)
    return ya, yb


def rms_norm_pair_rounded(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float, *,
                          pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
    """`rms_norm_pair`, and ya rounded to e4m3 per 1 x 128 block for the FP8 GEMMs that read it (module doc), in
    the same launch. Ca of at least 65 (a row tile of at least one 128-wide block)."""
    if triton.next_power_of_2(a.shape[-1]) < 128:
        raise ValueError(f"rms_norm_pair_rounded: rows of {a.shape[-1]} in a, fewer than one 128-wide block's tile")
    ya, yb, ra = _launch(a, wa, b, wb, eps, pdl, True)
    return ya, yb, ra


def _launch(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float, pdl: bool,
            round_a: bool) -> tuple[torch.Tensor, torch.Tensor, RoundedX | None]:
    _check_rows(a, wa, "a")
    _check_rows(b, wb, "b")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"rms_norm_pair: a has {a.shape[0]} rows, b {b.shape[0]}")
    T, ca, cb = a.shape[0], a.shape[1], b.shape[1]
    ya = torch.empty(T, ca, dtype=a.dtype, device=a.device)
    yb = torch.empty(T, cb, dtype=b.dtype, device=b.device)
    ra = rounded_x_buffers(T, ca, a.device) if round_a else None
    if T == 0:
        return ya, yb, ra
    rows = ra.q.shape[0] if ra is not None else T
    q, s = (ra.q, ra.s) if ra is not None else (ya, ya)  # (not read without ROUND_A)
    block_a, block_b = triton.next_power_of_2(ca), triton.next_power_of_2(cb)
    _rms_norm_pair_kernel[(rows, 2)](a, a.stride(0), wa, ya, ya.stride(0), b, b.stride(0), wb, yb, yb.stride(0), q, s,
                                     T, rows, eps, CA=ca, CB=cb, BLOCK_A=block_a, BLOCK_B=block_b, ROUND_A=round_a,
                                     PDL=pdl, num_warps=max(norm_warps(block_a), norm_warps(block_b)),
                                     launch_pdl=pdl)
    return ya, yb, ra
