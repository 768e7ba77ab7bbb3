"""Triton: the FP8 block-scaled GEMM family as the released model computes it, y = x @ W^T with x rounded to e4m3.

    x      [M, groups*K]  bf16 / fp16 / fp32 activations
    qw     [groups*N, K]  float8_e4m3fn weights, K a multiple of 128
    scale  [ceil(groups*N/128), K/128] uint8 e8m0 bytes v: the 128 x 128 block's scale is 2^(v - 127)
    y      [M, groups*N]  in x's dtype; grouped: output columns [g*N, (g+1)*N) read x's columns [g*K, (g+1)*K)

Semantics (DeepSeek's `act_quant` with power-of-two scales, ops/act_quant.py, then its block-scaled `fp8_gemm`):
each 1 x 128 block of x is rounded to e4m3 xq with a power-of-two scale s_x; y[m, n] = sum over K blocks b of
s_x[m, b] * s_w[n/128, b] * (xq[m, b] . wq[n, b]), each block's dot exact in fp32 (e4m3 products are exact in
fp32; tensor cores add them in fp32) and scaled once per block. `fp8_gemm_torch` is the torch twin; the Triton
launches differ from it by the order of fp32 sums only.

The MMA kernel, `_fp8_gemm_kernel`: the weight tile [BLOCK_N, 128] is the MMA's wide side and x's rows the narrow
one ("swap AB"), so M = 1 pads to 16 columns on the tensor cores, which at decode sizes have cycles to spare: the
kernel streams the weight at HBM speed. x is rounded in the prologue of each K step (QUANT_X: M small, x re-read
from L2 by every N tile) or read already rounded (`quantize_x`, one launch: large M, where each N tile rounding all
of x again would cost more than that launch; or `rounded`, the same rounding made by the kernel that produced x,
ops/act_quant.py's RoundedX, which spares that launch). K is split over programs where the output tiles leave SMs
idle: each writes an fp32 partial, the last of a tile to finish sums them in split order (deterministic) and stores
y (ops/linear.py `_store_or_sum`). At M = 1 the GEMV of ops/linear.py (products on CUDA cores, no MMA padding) may
run instead, rounding each 128 columns of x in its K loop: the same exact products, summed in another order. Which
kernel, tile sizes, stages, splits and x path a GEMM takes is read from the tuning table (ops/fp8_gemm_table.py),
per weight shape and M bucket; cuBLASLt's block-scaled GEMM (`torch._scaled_mm` on the same rounded x) is one of the
table's choices.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.act_quant import BLOCK, RoundedX, quantize_x_torch, round_block
from tp_runtime.ops.fp8_gemm_wgmma import fp8_gemm_wgmma, fp8_gemm_wgmma_ws, wgmma_fits
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton
from tp_runtime.ops.linear import (LinearConfig, dequantize, grouped_linear, linear_triton, rows_of,
                                   scaled_mm_weight_scales, store_or_sum, tile_counters)

GLUON_KERNELS = ("wgmma", "wgmma_ws")  # ops/fp8_gemm_wgmma.py's two kernels: one set of warps, or warp-specialized
SCALED_MM_ROWS = 16  # cuBLASLt refuses 1 x 128 scales whose row count (their leading dimension) is odd-sized


class Fp8GemmConfig(NamedTuple):
    """One launch of the family: the MMA kernel ("triton"), its Gluon twins in ops/fp8_gemm_wgmma.py (x rounded by
    one launch first, stages fed by TMA): one set of warps ("wgmma") or a loading warp and MMA warps
    ("wgmma_ws"); the GEMV ("gemv": M = 1, block_m 1, x rounded in its K loop), or cuBLASLt ("scaled_mm": the
    other fields unused)."""

    kernel: str  # "triton" | "wgmma" | "wgmma_ws" | "gemv" | "scaled_mm"
    block_m: int  # x rows a program covers (>= 16: the MMA's narrow side)
    block_n: int  # weight rows a program covers: 64 or 128 (inside one 128-row scale block), wgmma's up to 256;
    #               the GEMV's 16, 32 or 64
    splits: int  # programs over K (1: no partials)
    num_warps: int
    num_stages: int
    quant_x: bool  # round x in the K loop's prologue (else one quantize_x launch first)
    block_k: int = BLOCK  # columns a K step covers: 128 (one scale block) but in the GEMV (a multiple of 128)
    in_flight: int = 1  # wgmma: MMAs left running while the previous product is scaled (1, or 0: large tiles)
    k_per_wait: int = 1  # wgmma_ws: K steps whose MMAs are issued before one wait (1, 2 or 4)


def fp8_gemm_torch(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """The family's torch twin (module doc): x rounded per 1 x 128 block of each group's columns, times the
    dequantized weight in fp32, in x's dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    k = qw.shape[1]
    parts = [quantize_x_torch(x2[:, g * k:(g + 1) * k]) for g in range(groups)]
    xr = torch.cat([q.to(torch.float32) * s.repeat_interleave(BLOCK, 1)[:, :k] for q, s in parts], dim=1)
    w = dequantize(qw, scale, torch.float32)
    y = torch.nn.functional.linear(xr, w) if groups == 1 else grouped_linear(xr, w, groups)
    return y.to(x.dtype).view(*x.shape[:-1], qw.shape[0])


def default_config(m: int, n: int, k: int, n_sm: int) -> Fp8GemmConfig:
    """A safe configuration for a shape the tuning table lacks: 128 weight rows by the next power of two >= M
    (16 .. 128) columns, 4 stages, x rounded in the prologue up to 32 rows, K split until ~2 programs per SM
    with at least 4 K steps each."""
    bm = min(128, max(16, 1 << (m - 1).bit_length()))
    tiles = -(-n // 128) * -(-m // bm)
    splits = max(1, min(-(-2 * n_sm // tiles), k // BLOCK // 4))
    return Fp8GemmConfig("triton", bm, 128, splits, 4 if bm <= 64 else 8, 4, m <= 32)


def quantize_x(x: torch.Tensor, pdl: bool = False, rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [Mp, K], fp32 scales [Mp, K/128] with strides (1, Mp): the column-major layout
    `torch._scaled_mm` takes), Mp = M rounded up to `rows` (padding rows zero); one launch."""
    m, k = x.shape
    mp = triton.cdiv(m, rows) * rows
    q = torch.empty(mp, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(triton.cdiv(k, BLOCK), mp, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(mp, 16), triton.cdiv(k, BLOCK))
    _quantize_x_kernel[grid](x, q, s, m, mp, k, x.stride(0), BLOCK_R=16, PDL=pdl, num_warps=4, launch_pdl=pdl)
    return q, s.t()


def fp8_gemm(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int, c: Fp8GemmConfig,
             pdl: bool = False, rounded: RoundedX | None = None) -> torch.Tensor:
    """x [M, groups*K] @ W^T by configuration c (shapes: module doc); pdl: programmatic dependent launch.
    rounded: x already rounded by the kernel that produced it (`takes_rounded_x`): a launch that would round x
    by a quantize_x launch first reads it instead (the same values)."""
    x2 = rows_of(x)
    m, n, k = x2.shape[0], qw.shape[0], qw.shape[1]
    if c.kernel == "gemv":
        if m != 1:
            raise ValueError(f"fp8_gemm: the GEMV launch takes one row of x, got {m}")
        lc = LinearConfig(1, c.block_n, c.block_k, c.num_warps, c.num_stages, c.splits)
        return linear_triton(x, qw, scale, groups, lc, pdl, round_x=True)
    if c.kernel in GLUON_KERNELS and not wgmma_fits(n, k, groups, c.block_n):  # Triton's, in one scale block
        c = c._replace(kernel="triton", block_n=min(c.block_n, BLOCK))
    if k % BLOCK:  # blocks of x must not straddle groups: the in-loop rounding keeps each group's own blocks
        c = c._replace(kernel="triton", quant_x=True)  # (one quantize launch would not)
    if c.kernel == "scaled_mm":  # groups == 1, K a multiple of 128 (the table's rule)
        xq, xs = rounded or quantize_x(x2, pdl, SCALED_MM_ROWS)
        y = torch._scaled_mm(xq, qw.t(), xs, scaled_mm_weight_scales(scale), out_dtype=x.dtype)[:m]
    else:
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        part = torch.empty(c.splits, m, n, dtype=torch.float32, device=x.device) if c.splits > 1 else y
        launch = _launch_wgmma if c.kernel in GLUON_KERNELS else _launch_triton
        launch(x2, qw, scale, groups, c, pdl, y, part, rounded)
    return y.view(*x.shape[:-1], n)


def takes_rounded_x(c: Fp8GemmConfig, k: int) -> bool:
    """Whether launch c over K = k columns a group rounds x by a quantize_x launch first (so a RoundedX made by
    x's producer spares it); the GEMV and the Triton kernel with quant_x round x as they read it."""
    return k % BLOCK == 0 and c.kernel != "gemv" and not (c.kernel == "triton" and c.quant_x)


def _launch_wgmma(x2: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int, c: Fp8GemmConfig,
                  pdl: bool, y: torch.Tensor, part: torch.Tensor, rounded: RoundedX | None) -> None:
    # x rounded by one launch, then one of ops/fp8_gemm_wgmma.py's kernels into y (part: its split-K partials);
    # the warp-specialized one reads x's scales by TMA: rows padded to 4 (16 bytes)
    m, n = y.shape
    counters = tile_counters(x2.device, triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n))
    if c.kernel == "wgmma_ws":
        xq, xs = rounded or quantize_x(x2, pdl, 4)
        fp8_gemm_wgmma_ws(xq, xs, m, qw, scale, groups, c.block_m, c.block_n, c.splits, c.num_warps, c.num_stages,
                          c.k_per_wait, pdl, y, part, counters)
        return
    xq, xs = rounded or quantize_x(x2, pdl)
    fp8_gemm_wgmma(xq, xs, m, qw, scale, groups, c.block_m, c.block_n, c.splits, c.num_warps, c.num_stages,
                   c.in_flight, y, part, counters)


def _launch_triton(x2: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int, c: Fp8GemmConfig,
                   pdl: bool, y: torch.Tensor, part: torch.Tensor, rounded: RoundedX | None) -> None:
    # `_fp8_gemm_kernel` into y, x rounded in its prologue (quant_x) or by one launch first
    m, n, k = x2.shape[0], qw.shape[0], qw.shape[1]
    if c.quant_x:
        xq, xs = x2, x2  # the kernel rounds x itself; xs unused
        sxm, sxk = 0, 0
    else:
        xq, xs = rounded or quantize_x(x2, pdl)
        sxm, sxk = xs.stride(0), xs.stride(1)
    group_n = n // groups
    bn = c.block_n
    while group_n % bn:  # a tile's columns lie in one group
        bn //= 2
    grid = (triton.cdiv(m, c.block_m), triton.cdiv(n, bn), c.splits)  # a weight tile's M tiles launch together
    steps = triton.cdiv(triton.cdiv(k, BLOCK), c.splits)
    _fp8_gemm_kernel[grid](xq, xs, qw, scale, y, part, tile_counters(x2.device, grid[0] * grid[1]), m, n, k, group_n,
                           xq.stride(0), sxm, sxk, qw.stride(0), scale.stride(0), steps, c.splits, QUANT_X=c.quant_x,
                           BLOCK_M=c.block_m, BLOCK_N=bn, PDL=pdl, num_warps=c.num_warps,
                           num_stages=c.num_stages, launch_pdl=pdl)


@jit
def _fp8_gemm_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, GROUP_N, stride_xm, stride_xsm,
                     stride_xsk, stride_wn, stride_sn, STEPS, SPLITS, QUANT_X: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    # One program: y^T tile [BLOCK_N weight rows, BLOCK_M rows of x] over K blocks [split*STEPS, (split+1)*STEPS).
    # BLOCK_N <= 128 divides 128, so the tile's rows share one weight scale per K block; x's scale is per row.
    # The tile's columns lie in one group (BLOCK_N divides GROUP_N), whose inputs are x's columns [g*K, (g+1)*K).
    # M tiles vary fastest over the grid: the programs that read one weight tile run at once, and all but the
    # first find it in L2.
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    group = pid_n * BLOCK_N // GROUP_N
    x_ptr += group * K
    xs_ptr += group * ((K + 127) // 128) * stride_xsk
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, 128)
    m_ok, n_ok = rm < M, rn < N
    s_row = s_ptr + (pid_n * BLOCK_N // 128) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    lo = split * STEPS
    hi = tl.minimum(lo + STEPS, (K + 127) // 128)
    pdl_wait(PDL)
    # The weight scale's byte is loaded a K step ahead and used as loaded (no arithmetic on it until the step
    # that multiplies by it): the pipeliner stages only the dot's operands, and a scalar load used in the step
    # that issues it waits out a memory latency. x's row scales stay in their step: one step ahead they cost
    # registers enough to drop a program per SM, measured slower at M >= 128.
    wsb = tl.load(s_row + lo, mask=lo < hi, other=127)
    for kb in range(lo, hi):
        wsb_next = tl.load(s_row + kb + 1, mask=kb + 1 < hi, other=127)
        k_ok = (kb * 128 + rk) < K
        w = tl.load(w_ptr + rn[:, None] * stride_wn + (kb * 128 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        x_at = x_ptr + rm[:, None] * stride_xm + (kb * 128 + rk)[None, :]
        if QUANT_X:
            xq, xsc = round_block(tl.load(x_at, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32))
        else:
            xq = tl.load(x_at, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            xsc = tl.load(xs_ptr + rm * stride_xsm + kb * stride_xsk, mask=m_ok, other=0.0)
        acc += tl.dot(w, tl.trans(xq)) * (xsc * tl.exp2(wsb.to(tl.float32) - 127.0))[None, :]
        wsb = wsb_next
    pdl_trigger(PDL)
    offs = rm[None, :] * N + rn[:, None]  # y [M, N] seen as [BLOCK_N, BLOCK_M]
    store_or_sum(acc, y_ptr, part_ptr, cnt_ptr + pid_n * tl.num_programs(0) + pid_m, offs,
                  m_ok[None, :] & n_ok[:, None], split, M * N, SPLITS)


@jit
def _quantize_x_kernel(x_ptr, q_ptr, s_ptr, M, M_PAD, K, stride_xm, BLOCK_R: tl.constexpr, PDL: tl.constexpr):
    # Rows [BLOCK_R] x the 128 columns of block kb: q in e4m3, the scale at s[kb, row] (the transposed layout
    # _scaled_mm reads); rows M .. M_PAD - 1 read as zeros.
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    kb = tl.program_id(1)
    c = kb * 128 + tl.arange(0, 128)
    pdl_wait(PDL)
    x = tl.load(x_ptr + r[:, None] * stride_xm + c[None, :], mask=(r < M)[:, None] & (c < K)[None, :],
                other=0.0).to(tl.float32)
    pdl_trigger(PDL)
    q, sc = round_block(x)
    tl.store(q_ptr + r[:, None] * K + c[None, :], q, mask=(r < M_PAD)[:, None] & (c < K)[None, :])
    tl.store(s_ptr + kb * M_PAD + r, sc, mask=r < M_PAD)
