"""FP8 weight blocks as released: float8_e4m3fn values with one power-of-two (e8m0) scale per 128 x 128 block.

Quantize (for synthetic checkpoints and fp8 seeded weights) and dequantize (loading into bf16 / fp32).
"""

from __future__ import annotations

import torch

from tp_runtime.ops.linear import e8m0_scales

BLOCK = 128  # edge of a quantization block, rows and columns
FP8_MAX = 448.0  # largest finite float8_e4m3fn
E8M0 = getattr(torch, "float8_e8m0fnu", None)  # the scales' dtype, torch >= 2.7; without it their bytes are read raw


def n_blocks(n: int) -> int:
    """Blocks of BLOCK covering n rows or columns (the last one partial)."""
    return -(-n // BLOCK)


def dequantize_fp8(q: torch.Tensor, scale_bytes: torch.Tensor, row0: int = 0, col0: int = 0,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [rows, cols] fp8 (rows row0.., columns col0.. of a matrix) times the e8m0 scales of the blocks
    covering it ([sr, sc], first block the one holding (row0, col0)) -> [rows, cols] in dtype on q's device.

    Exact in bfloat16, float32 and float64: an fp8 value times a power of two needs 4 significant bits
    and an 8-bit exponent. Any origin works: a shard starting inside a block shares its scale.
    """
    rows, cols = q.shape
    s = e8m0_scales(scale_bytes.to(q.device)).to(dtype)
    s = s[torch.arange(row0, row0 + rows, device=q.device) // BLOCK - row0 // BLOCK]  # [rows, sc]
    w = q.to(dtype)
    if col0 % BLOCK == 0 and cols % BLOCK == 0:  # whole column blocks (every released shard): broadcast
        w.view(rows, cols // BLOCK, BLOCK).mul_(s[:, :, None])
    else:  # a block's scale per column: one [rows, cols] temporary
        w.mul_(s[:, torch.arange(col0, col0 + cols, device=q.device) // BLOCK - col0 // BLOCK])
    return w


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (float8_e4m3fn [out, in], e8m0 bytes uint8 [ceil(out/128), ceil(in/128)]).

    Each 128x128 block (edge blocks partial) gets the smallest power of two s with max|block| / s <= 448,
    so no value saturates and the largest lands in fp8's top binade.
    """
    out, inp = w.shape
    R, C = n_blocks(out), n_blocks(inp)
    padded = torch.zeros(R * BLOCK, C * BLOCK, dtype=torch.float32, device=w.device)
    padded[:out, :inp] = w
    blocks = padded.view(R, BLOCK, C, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))  # [R, C]
    mant, exp = torch.frexp(amax / FP8_MAX)  # amax/448 = mant * 2^exp, mant in [0.5, 1)
    k = torch.where(amax > 0, exp - (mant == 0.5).to(exp.dtype), 0).clamp(-127, 127)  # ceil(log2(amax/448))
    scale_bytes = (k + 127).to(torch.uint8)
    q = (blocks / e8m0_scales(scale_bytes)[:, None, :, None]).view_as(padded)[:out, :inp]  # exact: / 2^k
    return q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale_bytes


