"""DeepSeek's `act_quant` with power-of-two scales: activations rounded to e4m3 per 1 x 128 block, as the released
model rounds the inputs of its FP8 GEMMs (ops/fp8_gemm.py's MMA kernel and ops/linear.py's GEMV apply it).

    x  [M, K]  any float dtype  ->  xq [M, K] float8_e4m3fn, s [M, ceil(K/128)] fp32 powers of two, x ~ xq * s

Each block is divided by s = 2^ceil(log2(max(amax, 1e-4) / 448)) and rounded to e4m3 (nearest even; |x / s| <= 448
by the choice of s); a last, partial block is rounded as if padded with zeros. The exponent of s is read off amax's
fp32 bits, not from a rounded log2: amax = 1.f x 2^e; amax / 448 <= 2^(e - 8) exactly when 1.f <= 1.75
(448 = 1.75 x 2^8), so ceil(log2(amax / 448)) = e - 8 + (f > 0.75). Then x / s is a multiplication by an exact
power of two, and xq * s is exact in fp32 (and in bf16).

`quantize_x_torch` is the torch twin; `round_block` the Triton helper the kernels call (bit for bit the twin on
a GPU: tests/test_fp8_gemm_gpu.py). `RoundedX` is x rounded ahead of its GEMMs, in the layout the GEMMs read
(written by the kernels that produce x: ops/add_rms_norm.py, ops/rms_norm_pair.py; read by ops/fp8_gemm.py),
and `store_rounded_row` the Triton helper that writes one row of it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.kernel_support import jit, tl

BLOCK = 128  # the FP8 format's block: 1 x 128 for activations, 128 x 128 for weights (ops/linear.py)
AMAX_FLOOR = 1e-4  # DeepSeek's act_quant: a block whose |x| are all below it is scaled as if its max were 1e-4
ROUNDED_ROWS = 16  # RoundedX pads its rows to a multiple of this: what every FP8 GEMM launch takes (cuBLASLt: 16)


class RoundedX(NamedTuple):
    """x [M, K] rounded per 1 x 128 block (module doc) by the kernel that produced x, for the FP8 GEMMs that read x:
    the layout ops/fp8_gemm.py's `quantize_x` makes with rows padded to ROUNDED_ROWS (padding rows are a zero
    row's rounding: codes 0)."""

    q: torch.Tensor  # [Mp, K] float8_e4m3fn, Mp = M rounded up to ROUNDED_ROWS
    s: torch.Tensor  # [Mp, ceil(K/128)] fp32 powers of two, strides (1, Mp): column-major, as cuBLASLt reads it


def rounded_x_buffers(m: int, k: int, device: torch.device) -> RoundedX:
    """Empty RoundedX buffers for x [m, k]."""
    mp = -(-m // ROUNDED_ROWS) * ROUNDED_ROWS
    q = torch.empty(mp, k, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(-(-k // BLOCK), mp, dtype=torch.float32, device=device)
    return RoundedX(q, s.t())


def e4m3_exponents_torch(amax: torch.Tensor) -> torch.Tensor:
    """amax >= AMAX_FLOOR, fp32 -> int32 e with 2^e = 2^ceil(log2(amax / 448)), from amax's bits (module doc)."""
    bits = amax.to(torch.float32).view(torch.int32)
    return ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)


def quantize_x_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K/128)]), the semantics of the module doc (a last,
    partial block is rounded as if padded with zeros)."""
    m, k = x.shape
    kb = -(-k // BLOCK)
    blocks = torch.nn.functional.pad(x.to(torch.float32), (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    amax = blocks.abs().amax(-1).clamp_min(AMAX_FLOOR)
    e = e4m3_exponents_torch(amax)
    inv = ((127 - e) << 23).view(torch.float32)  # 2^-e, exact
    q = (blocks * inv[..., None]).to(torch.float8_e4m3fn).view(m, kb * BLOCK)[:, :k]
    return q, ((e + 127) << 23).view(torch.float32)


@jit
def e4m3_scale_bits(amax):
    # amax [R] fp32 (>= 1e-4) -> the exponent e of 2^ceil(log2(amax / 448)) (module doc), int32
    bits = amax.to(tl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)


@jit
def round_block(x):
    # x [R, 128] fp32 -> (e4m3 [R, 128], scales 2^e [R] fp32): one 1 x 128 block per row, exact power-of-two scales
    e = e4m3_scale_bits(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4))
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    q = (x * inv[:, None]).to(tl.float8e4nv)
    return q, ((e + 127) << 23).to(tl.float32, bitcast=True)


@jit
def store_rounded_row(y, q_ptr, s_ptr, t, C: tl.constexpr, MP, BLOCK_C: tl.constexpr):
    # y [BLOCK_C] fp32, row t of x (zeros past C) -> its 1 x 128 blocks rounded into RoundedX's buffers: codes at
    # q_ptr + t * C + c, block b's scale at s_ptr + b * MP + t (the transposed scale layout).
    nb: tl.constexpr = (BLOCK_C + 127) // 128
    q, sc = round_block(tl.reshape(y, (nb, 128)))
    b = tl.arange(0, nb)
    c = b[:, None] * 128 + tl.arange(0, 128)[None, :]
    tl.store(q_ptr + t * C + c, q, mask=c < C)
    tl.store(s_ptr + b * MP + t, sc, mask=b * 128 < C)
