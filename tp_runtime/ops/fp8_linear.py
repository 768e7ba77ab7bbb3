"""y = x @ W^T with W in FP8 as released: float8_e4m3fn values, one power-of-two scale per 128 x 128 block.

    x      [M, K]   bf16 (or fp32) activations ([M, groups*K] for a grouped GEMM, as wo_a's)
    qw     [N, K]   float8_e4m3fn
    scale  [ceil(N/128), ceil(K/128)] uint8 e8m0 bytes v: the block's scale is 2^(v - 127)
    y      [M, N]   in x's dtype

`fp8_linear` is the one place the path is chosen: the Triton kernel on CUDA (any M: decode GEMVs and
prefill GEMMs alike, tiles sized by M), the torch path elsewhere (dequantize, then a plain matmul: the
semantics, and the CPU tests' path). The kernel dequantizes each [BLOCK_N, 128] tile of W in registers
(exact: an e4m3 value times a power of two fits bf16) and accumulates in fp32 with tl.dot; a tile's K
range is one scale block, so each row of the tile needs one scale.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the module imports, the kernel cannot run (the torch path does)
    triton = tl = None

BLOCK = 128  # the checkpoint's quantization block: rows and columns


def e8m0_scales(scale: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 bytes -> float32 2^(v - 127), exactly (v = 0 is 2^-127)."""
    bits = (scale.to(torch.int32) << 23).view(torch.float32)
    return torch.where(scale == 0, 2.0 ** -127, bits)


def dequantize(qw: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """qw [N, K] fp8, scale [ceil(N/128), ceil(K/128)] e8m0 -> W [N, K] in dtype (exact in bf16 and fp32)."""
    n, k = qw.shape
    s = e8m0_scales(scale).repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (qw.to(torch.float32) * s).to(dtype)


def fp8_linear_torch(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    w = dequantize(qw, scale, x.dtype)
    if groups == 1:
        return torch.nn.functional.linear(x, w)
    xs, ws = x.chunk(groups, dim=-1), w.chunk(groups, dim=0)
    return torch.cat([torch.nn.functional.linear(a, b) for a, b in zip(xs, ws)], dim=-1)


def fp8_linear(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """x [M, groups*K] @ dequantized qw [groups*N, K]^T, group by group -> [M, groups*N]: group g's
    output columns [g*N, (g+1)*N) read x's columns [g*K, (g+1)*K) (wo_a of DSV4; groups = 1: a plain linear)."""
    if x.is_cuda and triton is not None:
        return fp8_linear_triton(x, qw, scale, groups)
    return fp8_linear_torch(x, qw, scale, groups)


def tile_config(m: int, n: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for an [m, n] output. Decode (m <= 16): one 16-row tile
    and column tiles narrow enough that a matrix spreads over at least ~2 programs per SM; prefill:
    square-ish tiles."""
    if m <= 16:
        return 16, (16 if n <= 8192 else 64), 4, 4
    if m <= 64:
        return 64, 64, 4, 3
    return 128, 128, 8, 3


def fp8_linear_triton(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape[0], x2.shape[1] // groups
    n = qw.shape[0]
    group_n = n // groups
    fits = (x2.shape[1] == groups * k and qw.shape[1] == k and qw.stride(1) == 1 and n % groups == 0
            and (groups == 1 or group_n % 16 == 0)
            and scale.shape == ((n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK))
    if not fits:
        raise ValueError(f"fp8_linear: x {tuple(x.shape)}, weight {tuple(qw.shape)}, scale {tuple(scale.shape)}, "
                         f"groups {groups} do not fit (scale: one e8m0 byte per 128 x 128 block)")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm, bn, warps, stages = tile_config(m, n)
    while groups > 1 and group_n % bn:  # a tile's columns must lie in one group
        bn //= 2
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    _fp8_linear_kernel[grid](x2, qw, scale, y, m, n, k, group_n, x2.stride(0), qw.stride(0), scale.stride(0),
                             y.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=BLOCK, num_warps=warps, num_stages=stages)
    return y.view(*lead, n)


if triton is not None:

    @triton.jit
    def _fp8_linear_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, GROUP_N, stride_xm, stride_wn, stride_sn,
                           stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program: output tile [BLOCK_M, BLOCK_N], the whole K range in 128-column steps (one scale block).
        # Its columns lie in one group (BLOCK_N divides GROUP_N), whose inputs are x's columns [g*K, (g+1)*K).
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        x_ptr += (pid_n * BLOCK_N // GROUP_N) * K
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok, n_ok = rm < M, rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k0 = kb * BLOCK_K
            k_ok = (k0 + rk) < K
            x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)
            v = tl.load(s_ptr + (rn // BLOCK_K) * stride_sn + kb, mask=n_ok, other=127)
            s = tl.exp2(v.to(tl.float32) - 127.0)  # [BLOCK_N] the rows' block scales, exact powers of two
            wb = (w.to(tl.float32) * s[:, None]).to(x.dtype)
            acc += tl.dot(x, tl.trans(wb))
        y = acc.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y, mask=m_ok[:, None] & n_ok[None, :])
