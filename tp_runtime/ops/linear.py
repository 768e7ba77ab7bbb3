"""Weight GEMMs y = x @ W^T in Triton for decode and prefill: FP8 block-scaled weights as released, and the
grouped bf16 GEMM of wo_a; the torch path beside them.

    x      [M, K]   bf16 / fp16 / fp32 activations ([M, groups*K] for a grouped GEMM, as wo_a's)
    W      [N, K]   run dtype, or qw float8_e4m3fn with
    scale  [ceil(N/128), ceil(K/128)] uint8 e8m0 bytes v: the 128 x 128 block's scale is 2^(v - 127)
    y      [M, N]   in x's dtype; grouped: output columns [g*N/groups, (g+1)*N/groups) read x's columns
                    [g*K, (g+1)*K)

`fp8_linear` is the one place the FP8 path is chosen: the Triton kernel on a CUDA tensor when Triton
imports (any M: tiles sized by M), the torch path elsewhere (dequantize, then plain matmuls: the
semantics, and the CPU tests' path).

The kernels: at M = 1 a GEMV (fp32 products, no tensor cores: a 16-row tl.dot tile would be 15/16 padding);
else one program per [BLOCK_M, BLOCK_N] output tile and split of K, fp32 accumulation with tl.dot. A tile
has at most 128 rows, aligned, so all its rows share one scale per 128 columns. The GEMV multiplies x by
those powers of two (exact) and only widens the FP8 values; the tl.dot kernel scales the FP8 tile as it
widens it to x's dtype (exact for e4m3; measured faster there than scaling x). At decode sizes a matrix
has too few output tiles to fill the GPU with long serial K loops, so K is split over programs that write
fp32 partials [S, M, N], and a second kernel sums them in a fixed order (deterministic) and casts.

The kernels also take bf16 weights (scale None); measured on an H200 they are slower than cuBLAS there
(benchmarks/fp8_gemm.py), so bf16 weights go to cuBLAS: `grouped_linear` is one strided batched GEMM over
views of x and of y, without copies.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.kernel_support import jit, sm_count, tl, triton

BLOCK = 128  # the checkpoint's quantization block: rows and columns; also the kernel's K step


def e8m0_scales(scale: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 bytes -> float32 2^(v - 127), exactly (v = 0 is 2^-127)."""
    bits = (scale.to(torch.int32) << 23).view(torch.float32)
    return torch.where(scale == 0, 2.0 ** -127, bits)


def dequantize(qw: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """qw [N, K] fp8, scale [ceil(N/128), ceil(K/128)] e8m0 -> W [N, K] in dtype (exact in bf16 and fp32)."""
    n, k = qw.shape
    s = e8m0_scales(scale).repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (qw.to(torch.float32) * s).to(dtype)


def grouped_linear(x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    """x [M, groups*K] @ W [groups*N, K]^T group by group -> [M, groups*N], W in x's dtype: one batched
    GEMM reading x's groups and writing y's in place (strided views [groups, M, K] and [groups, M, N])."""
    m, n = x.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    torch.bmm(x.view(m, groups, -1).transpose(0, 1), w.view(groups, n // groups, -1).transpose(1, 2),
              out=y.view(m, groups, n // groups).transpose(0, 1))
    return y


def fp8_linear_torch(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    w = dequantize(qw, scale, x.dtype)
    return torch.nn.functional.linear(x, w) if groups == 1 else grouped_linear(x, w, groups)


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and triton is not None


def fp8_linear(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """x [M, groups*K] @ dequantized qw [groups*N, K]^T, group by group -> [M, groups*N] (groups = 1: a plain
    linear; wo_a of DSV4: group g's output columns read x's columns of group g)."""
    return linear_triton(x, qw, scale, groups) if _use_triton(x) else fp8_linear_torch(x, qw, scale, groups)


class LinearConfig(NamedTuple):
    """Launch configuration of the weight-GEMM kernels (fixed per shape; see `tile_config`)."""

    block_m: int  # 1: the GEMV kernel (M = 1)
    block_n: int
    block_k: int  # a multiple of the 128-column scale block
    num_warps: int
    num_stages: int
    splits: int  # programs over K; > 1: fp32 partials summed by a second kernel


def tile_config(m: int, n: int, k: int, n_sm: int) -> LinearConfig:
    """The configuration for an [m, n] output over k columns.

    M = 1: the GEMV kernel, 16 rows and 512 columns a step (the best of a sweep on an H200 at every FP8
    shape of Flash, benchmarks/fp8_gemm.py --sweep). Larger M: tl.dot tiles growing with M; K split by
    `k_splits`."""
    if m == 1:
        return LinearConfig(1, 16, 512, 4, 3, k_splits(1, n, k, 16, 512, n_sm))
    bm = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 256 else 128
    bn = (16 if n <= 8192 else 64) if m <= 16 else 64 if m <= 256 else 128
    return LinearConfig(bm, bn, BLOCK, 4 if bm * bn <= 64 * 64 else 8, 4 if m <= 16 else 3,
                        k_splits(m, n, k, bn, BLOCK, n_sm, block_m=bm))


def k_splits(m: int, n: int, k: int, block_n: int, block_k: int, n_sm: int, block_m: int = 1) -> int:
    """Programs over K: until there are ~8 programs per SM, each with at least 2 (GEMV) or 4 K steps, and
    while the fp32 partials (written and read once: 8 bytes an output element per split) stay under the
    FP8 weight's bytes."""
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    min_steps = 2 if m == 1 else 4
    return max(1, min(triton.cdiv(8 * n_sm, tiles), triton.cdiv(k, block_k) // min_steps, k // (8 * m)))


def _check_fits(x2: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, groups: int, x: torch.Tensor) -> None:
    k = x2.shape[1] // groups
    n = w.shape[0]
    fits = (x2.shape[1] == groups * k and w.shape[1] == k and w.stride(1) == 1 and n % groups == 0
            and (groups == 1 or (n // groups) % 16 == 0)
            and (scale is None or scale.shape == (triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK)))
            and (scale is not None or w.dtype == x.dtype))
    if not fits:
        what = f"scale {tuple(scale.shape)}" if scale is not None else f"dtype {w.dtype} (x: {x.dtype})"
        raise ValueError(f"linear: x {tuple(x.shape)}, weight {tuple(w.shape)}, {what}, groups {groups} do not "
                         f"fit (FP8: one e8m0 scale per 128 x 128 block; bf16: the weight in x's dtype)")


def linear_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, groups: int = 1,
                  config: LinearConfig | None = None) -> torch.Tensor:
    """The kernel for W in FP8 with block scales (scale given) or in x's dtype (scale None); config: one
    to use instead of `tile_config`'s (benchmarks)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    _check_fits(x2, w, scale, groups, x)
    m, k, n = x2.shape[0], x2.shape[1] // groups, w.shape[0]
    group_n = n // groups
    c = config or tile_config(m, n, k, sm_count(x.device))
    bn = c.block_n
    while groups > 1 and group_n % bn:  # a tile's columns must lie in one group
        bn //= 2
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    steps_per_split = triton.cdiv(triton.cdiv(k, c.block_k), c.splits)
    part = torch.empty(c.splits, m, n, dtype=torch.float32, device=x.device) if c.splits > 1 else y
    s = scale if scale is not None else w  # unused pointer when the weight has no scales
    if c.block_m == 1:  # M = 1: the GEMV kernel
        _gemv_kernel[(triton.cdiv(n, bn), c.splits)](
            x2, w, s, part, n, k, group_n, w.stride(0), s.stride(0), m * n, steps_per_split,
            HAS_SCALE=scale is not None, BLOCK_N=bn, BLOCK_K=c.block_k, num_warps=c.num_warps,
            num_stages=c.num_stages)
    else:
        _linear_kernel[(triton.cdiv(n, bn), triton.cdiv(m, c.block_m), c.splits)](
            x2, w, s, part, m, n, k, group_n, x2.stride(0), w.stride(0), s.stride(0), n, m * n, steps_per_split,
            HAS_SCALE=scale is not None, BLOCK_M=c.block_m, BLOCK_N=bn, BLOCK_K=BLOCK,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=c.num_warps,
            num_stages=c.num_stages)
    if c.splits > 1:
        _sum_splits_kernel[(triton.cdiv(m * n, 1024),)](part, y, m * n, c.splits, BLOCK_E=1024, num_warps=4)
    return y.view(*lead, n)


@jit
def _linear_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, GROUP_N, stride_xm, stride_wn, stride_sn, stride_ym,
                   stride_ys, STEPS, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    # One program: output tile [BLOCK_M, BLOCK_N] over K steps [split*STEPS, (split+1)*STEPS) of 128
    # columns; its output is y itself (one split) or split's fp32 partial plane y + split * stride_ys.
    # Its columns lie in one group (BLOCK_N divides GROUP_N), whose inputs are x's columns [g*K, (g+1)*K).
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x_ptr += (pid_n * BLOCK_N // GROUP_N) * K
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kb_end = tl.minimum((split + 1) * STEPS, tl.cdiv(K, BLOCK_K))
    for kb in range(split * STEPS, kb_end):
        k0 = kb * BLOCK_K
        k_ok = (k0 + rk) < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        if HAS_SCALE:  # the tile's rows lie in one 128-row block: one scale, exact in x's dtype
            v = tl.load(s_ptr + (pid_n * BLOCK_N // 128) * stride_sn + kb)
            w = (w.to(tl.float32) * tl.exp2(v.to(tl.float32) - 127.0)).to(x.dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)  # fp32 x: IEEE products, as torch
    y = acc.to(y_ptr.dtype.element_ty)
    y_ptr += split * stride_ys
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y, mask=m_ok[:, None] & n_ok[None, :])

@jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K, GROUP_N, stride_wn, stride_sn, stride_ys, STEPS,
                 HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # M = 1: rows [BLOCK_N] of y over K steps [split*STEPS, (split+1)*STEPS) of BLOCK_K columns, without
    # tl.dot (whose 16-row tiles would be 15/16 padding): products summed in an fp32 [BLOCK_N, BLOCK_K]
    # tile, reduced once at the end; x times the block scales, in fp32.
    pid_n, split = tl.program_id(0), tl.program_id(1)
    x_ptr += (pid_n * BLOCK_N // GROUP_N) * K
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    kb_end = tl.minimum((split + 1) * STEPS, tl.cdiv(K, BLOCK_K))
    for kb in range(split * STEPS, kb_end):
        kk = kb * BLOCK_K + rk
        k_ok = kk < K
        x = tl.load(x_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        if HAS_SCALE:  # the tile's rows lie in one 128-row block: its scales, one per 128 columns, go on x
            v = tl.load(s_ptr + (pid_n * BLOCK_N // 128) * stride_sn + kk // 128, mask=k_ok, other=127)
            x = x * tl.exp2(v.to(tl.float32) - 127.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += w * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + split * stride_ys + rn, y.to(y_ptr.dtype.element_ty), mask=n_ok)

@jit
def _sum_splits_kernel(part_ptr, y_ptr, E, SPLITS, BLOCK_E: tl.constexpr):
    # y [E] = sum over s of part[s, E] (fp32, in split order), cast to y's dtype.
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    ok = e < E
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + s * E + e, mask=ok, other=0.0)
    tl.store(y_ptr + e, acc.to(y_ptr.dtype.element_ty), mask=ok)
