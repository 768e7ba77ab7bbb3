"""Skinny weight GEMMs of decode, y = x @ W^T for M <= 16 rows with W in the run dtype (bf16 as nn.Linear
stores it), optionally behind the RMSNorm of x's rows: one Triton launch, PDL-capable (cuBLAS is not).

    x  [M, K]  bf16 / fp16 / fp32, last dim contiguous, any row stride
    W  [N, K]  x's dtype, last dim contiguous
    g  [K]     the norm's weight, or None: with it y = RMSNorm(x; g, eps) @ W^T
    y  [M, N]  contiguous, x's dtype

Two kernels, picked per shape by `gemv_config` (any M runs; the table is set for M <= 32):
- "fma" (M = 1): products on CUDA cores in fp32, an accumulator [BLOCK_N, BLOCK_K] reduced once after the
  K loop (a tensor-core tile would be 15/16 padding). Rows past the first are further programs.
- "dot" (M > 1): tl.dot with the weight tile as the MMA's wide side (BLOCK_N rows) and x^T the narrow one
  (BLOCK_M >= 16 columns: "swap AB"), as ops/linear.py's tile kernel.
Split-K as in ops/linear.py, whose helpers these are (`k_splits`, `tile_counters`, `store_or_sum`): programs
over K write fp32 partials, the last program of a tile (an atomic counter) sums them in split order
(deterministic), casts, stores and resets its counter: one launch a GEMM, capturable (sizes fixed per
shape, no host reads; counters made at the eager warm-up).

The norm prologue: rstd[m] = rsqrt(sum_k x[m, k]^2 / K + eps) is a per-row scale, so it commutes with the
product: y[m, n] = rstd[m] * sum_k (x[m, k] g[k]) W[n, k]. Each program multiplies its x tiles by g and
sums the squares of its own K range (x is loaded anyway: no extra reads, where recomputing the whole row
in every program would read M*K more elements per program); the program that completes a tile adds the
splits' sums and applies rstd. Rounding against the unfused `rms_norm` then `F.linear`: those round the
normed x to the dtype (bf16: up to 2^-9 relative per element) before the product; here the fma kernel
keeps x*g in fp32 and the dot kernel rounds x*g (not x*rstd*g) to the dtype. So a bf16 output moves by
about one such rounding step (relative error of y in fp32 norm ~1.6e-3, bound 8e-3 in the tests); fp32 by
the summation order only.

Rounding without the norm: the same inputs, fp32 accumulation in another order than cuBLAS's (which may
also reduce split-K partials in bf16: torch's allow_bf16_reduced_precision_reduction), both rounded once to
the dtype: the relative error of y in fp32 norm is ~1e-3 or less (bound 8e-3 in the tests), and within
one output rounding (2^-9) of the float64 product of the same inputs.

Where the Triton GEMV replaces cuBLAS is one table (`use_triton_gemv`), filled from
benchmarks/gemv_bf16.py on an H200.

PDL (`pdl=True`): programmatic dependent launch; `gdc_wait` before the first load of x (the previous
kernel's output), `gdc_launch_dependents` after the K loop, its last load of x.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, sm_count, tl, triton
from tp_runtime.ops.linear import k_splits, rows_of, store_or_sum, tile_counters

# Where the Triton GEMV replaces cuBLAS: (N, K) -> the largest M up to which it was faster inside a CUDA
# graph (benchmarks/gemv_bf16.py prints these tables from its measurements); NORM: with the norm prologue,
# against ops/rms_norm.py's kernel followed by cuBLAS. Empty until measured: every GEMM stays on cuBLAS.
# (N, K) -> the largest M at which `gemv` beat cuBLAS (norm: RMSNorm kernel + cuBLAS) at every M up to it, without
# PDL, inside CUDA graphs on one H200 (benchmarks/gemv_bf16.py; results/h200-2026-12-01-tp-scaling/kernels/). At
# Flash dims cuBLAS wins nearly everywhere from M = 2; the Triton kernel wins at M = 1 on narrow shapes: wx of
# window-only layers (1536 x 4096, 0.96x), wq_b and wo_b at tp 8 (4096 x 1024, 0.99x; 0.88x with PDL), and behind
# q_norm wq_b at tp 8 (0.92x) and the indexer's wq_b (8192 x 1024, 0.92x; 0.84x with PDL).
TRITON_GEMV_MAX_M: dict[tuple[int, int], int] = {(1536, 4096): 1, (4096, 1024): 1}
TRITON_GEMV_NORM_MAX_M: dict[tuple[int, int], int] = {(4096, 1024): 1, (8192, 1024): 1}


def use_triton_gemv(m: int, n: int, k: int, norm: bool = False) -> bool:
    """Whether y [m, n] = x [m, k] @ W [n, k]^T (norm: behind an RMSNorm of x) runs on `gemv` rather than
    cuBLAS (norm: rather than the RMSNorm kernel and cuBLAS)."""
    return 0 < m <= (TRITON_GEMV_NORM_MAX_M if norm else TRITON_GEMV_MAX_M).get((n, k), 0)


class GemvConfig(NamedTuple):
    """Launch configuration of `gemv` (fixed per shape; see `gemv_config`)."""

    dot: bool  # the tl.dot kernel; else the fma kernel (block_m 1)
    block_m: int  # rows of x a program: 1 (fma) or >= 16 (dot)
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    splits: int  # programs over K; > 1: fp32 partials summed by the last program of a tile


def gemv_config(m: int, n: int, k: int, n_sm: int) -> GemvConfig:
    """The configuration of an [m, n] output over k columns. M = 1: the fma kernel, 16 rows of W and 512
    columns a step (16 KB of bf16), ~8 programs per SM, as ops/linear.py's FP8 GEMV. M > 1: the dot kernel,
    64 rows of W by 16 or 32 rows of x, 128 columns a step, 3 stages (~60 KB of shared memory: 3 programs
    per SM), ~3 programs per SM. Starting points, to be set from benchmarks/gemv_bf16.py --sweep."""
    if m == 1:
        return GemvConfig(False, 1, 16, 512, 4, 3, k_splits(1, n, k, 16, 512, n_sm, per_sm=8))
    bm = min(32, max(16, triton.next_power_of_2(m)))
    return GemvConfig(True, bm, 64, 128, 4, 3, k_splits(m, n, k, 64, 128, n_sm, block_m=bm, per_sm=3))


@jit
def _finish(acc, ss, y_ptr, part_ptr, ss_ptr, cnt_ptr, rm, rn, M, N, K, eps, split, SPLITS,
            NORM: tl.constexpr, BLOCK_M: tl.constexpr):
    # acc [BLOCK_M, BLOCK_N] fp32 (rows rm of x, columns rn of y); ss [BLOCK_M]: this split's sums of x^2.
    # Without the norm: linear.py's epilogue. With it: the same, each split's ss beside its partial (ss_ptr:
    # this tile's [SPLITS, BLOCK_M]), and rstd applied to the total by the program that completes the tile.
    offs = rm[:, None] * N + rn[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if not NORM:
        store_or_sum(acc, y_ptr, part_ptr, cnt_ptr, offs, mask, split, M * N, SPLITS)
    elif SPLITS == 1:
        tl.store(y_ptr + offs, (acc * tl.rsqrt(ss / K + eps)[:, None]).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        r = tl.arange(0, BLOCK_M)
        tl.store(part_ptr + split * M * N + offs, acc, mask=mask, cache_modifier=".wt")
        tl.store(ss_ptr + split * BLOCK_M + r, ss, cache_modifier=".wt")
        tl.debug_barrier()  # every thread's partial is written before the count moves
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            tot = tl.zeros(acc.shape, dtype=tl.float32)
            sst = tl.zeros(ss.shape, dtype=tl.float32)
            for s in range(SPLITS):
                tot += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cv")
                sst += tl.load(ss_ptr + s * BLOCK_M + r, cache_modifier=".cv")
            tl.store(y_ptr + offs, (tot * tl.rsqrt(sst / K + eps)[:, None]).to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr, 0)


@jit
def _fma_kernel(x_ptr, w_ptr, g_ptr, y_ptr, part_ptr, ss_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, STEPS,
                SPLITS, eps, NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # Row pid_m of y, columns [BLOCK_N] over K steps [split*STEPS, (split+1)*STEPS) of BLOCK_K: products in an
    # fp32 [BLOCK_N, BLOCK_K] tile, reduced once at the end. x is kept [1, BLOCK_K] so that the epilogue
    # sees [BLOCK_M = 1, BLOCK_N].
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    pdl_wait(PDL)
    for kb in range(split * STEPS, tl.minimum((split + 1) * STEPS, tl.cdiv(K, BLOCK_K))):
        kk = kb * BLOCK_K + rk
        k_ok = kk < K
        x = tl.load(x_row + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]  # [1, BLOCK_K]
        if NORM:
            ss += x * x
            x = x * tl.load(g_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += w * x
    pdl_trigger(PDL)
    tile = pid_m * tl.num_programs(0) + pid_n
    _finish(tl.sum(acc, axis=1)[None, :], tl.sum(ss, axis=1), y_ptr, part_ptr, ss_ptr + tile * SPLITS, cnt_ptr + tile,
            pid_m + tl.arange(0, 1), rn, M, N, K, eps, split, SPLITS, NORM, 1)


@jit
def _dot_kernel(x_ptr, w_ptr, g_ptr, y_ptr, part_ptr, ss_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, STEPS,
                SPLITS, eps, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # y^T tile [BLOCK_N rows of W, BLOCK_M rows of x] over K steps [split*STEPS, (split+1)*STEPS): the weight
    # tile is the MMA's wide side. With the norm, x^T is multiplied by g in fp32 and rounded to W's dtype
    # for the MMA; its squares are summed per row of x.
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K, BLOCK_M), dtype=tl.float32)
    pdl_wait(PDL)
    for kb in range(split * STEPS, tl.minimum((split + 1) * STEPS, tl.cdiv(K, BLOCK_K))):
        kk = kb * BLOCK_K + rk
        k_ok = kk < K
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_ptr + rm[None, :].to(tl.int64) * stride_xm + kk[:, None], mask=m_ok[None, :] & k_ok[:, None],
                     other=0.0)  # x^T [BLOCK_K, BLOCK_M]
        if NORM:
            xf = xt.to(tl.float32)
            ss += xf * xf
            xt = (xf * tl.load(g_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)[:, None]).to(w.dtype)
        acc = tl.dot(w, xt, acc, input_precision=PRECISION)
    pdl_trigger(PDL)
    tile = pid_m * tl.num_programs(0) + pid_n
    _finish(tl.trans(acc), tl.sum(ss, axis=0), y_ptr, part_ptr, ss_ptr + tile * SPLITS * BLOCK_M, cnt_ptr + tile,
            rm, rn, M, N, K, eps, split, SPLITS, NORM, BLOCK_M)


def _check(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None) -> None:
    k = x.shape[-1]
    fits = (x.dim() == 2 and weight.dim() == 2 and weight.shape[1] == k and weight.stride(1) == 1
            and weight.dtype == x.dtype and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and (norm_weight is None or (norm_weight.shape == (k,) and norm_weight.stride(0) == 1)))
    if not fits:
        g = "" if norm_weight is None else f", norm weight {tuple(norm_weight.shape)}"
        raise ValueError(f"gemv: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}{g} do "
                         f"not fit: x [M, K] and weight [N, K] of one dtype (bf16 / fp16 / fp32), norm weight [K]")


def gemv(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0, *,
         config: GemvConfig | None = None, counters: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ weight [N, K]^T (norm_weight [K] given: RMSNorm(x; norm_weight, eps) @ weight^T),
    contiguous, in x's dtype; one launch. x: any row stride, last dim contiguous; weight in x's dtype.

    config: instead of `gemv_config`'s (benchmarks). counters: int32 zeros, one per output tile, for a
    split-K GEMM that may run at the same time as another on a second stream (the default, linear.py's
    per-device buffer, serves one stream: GEMMs of one stream run in turn). pdl: programmatic dependent launch.
    """
    _check(x, weight, norm_weight)
    x = rows_of(x)
    m, k, n = x.shape[0], x.shape[1], weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    c = config or gemv_config(m, n, k, sm_count(x.device))
    grid = (triton.cdiv(n, c.block_n), triton.cdiv(m, c.block_m), c.splits)
    tiles = grid[0] * grid[1]
    if counters is None:
        counters = tile_counters(x.device, tiles)
    elif counters.dtype != torch.int32 or counters.numel() < tiles:
        raise ValueError(f"gemv: counters must be int32 with at least {tiles} elements")
    norm = norm_weight is not None
    part = torch.empty(c.splits, m, n, dtype=torch.float32, device=x.device) if c.splits > 1 else y
    ss = torch.empty(tiles * c.splits * c.block_m, dtype=torch.float32, device=x.device) if norm and c.splits > 1 else y
    g = norm_weight if norm else weight  # unused pointer without the norm
    steps = triton.cdiv(triton.cdiv(k, c.block_k), c.splits)
    args = (x, weight, g, y, part, ss, counters, m, n, k, x.stride(0), weight.stride(0), steps, c.splits, eps)
    if c.dot:
        _dot_kernel[grid](*args, NORM=norm, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                          PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
                          num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl)
    else:
        _fma_kernel[grid](*args, NORM=norm, BLOCK_N=c.block_n, BLOCK_K=c.block_k, PDL=pdl,
                          num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl)
    return y
