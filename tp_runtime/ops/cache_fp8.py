"""FP8 cache rows as released: the byte layouts, their torch quantize / dequantize, and the Triton helpers
that read and write them in place.

Attention row of D = Dn + Dr dims (Flash: Dn 448, Dr 64), stored as uint8 [..., row_bytes(D, Dr)]:

    bytes [0, Dn)                     the nope dims as e4m3, each block of 64 divided by its scale
    bytes [Dn, Dn + 2*Dr)             the rope dims as bf16 (little-endian)
    bytes [Dn + 2*Dr, + Dn/64)        one e8m0 scale per 64 nope dims: byte v means 2^(v - 127)
    then zeros up to a multiple of 16 (Flash: 448 + 128 + 7 = 583 -> 592)

The released layout pads to 8 bytes (584); rows here are padded to 16 so that every row starts 16-byte aligned
and kernels gather them in 16-byte pieces (1.4 % more bytes a row). FlashMLA keeps 584 bytes a token and the
same alignment by storing a page's scale bytes apart from its 576-byte rows.

Indexer keys of Id dims (Flash: 128) as two tensors, DeepSeek's reference layout (its V3.2 inference code's
k_cache and k_scale_cache):

    codes   uint8 [..., Id]     the Id values as e4m3, each divided by the key's scale
    scales  float32 [...]       one power-of-two scale per key

key_bytes(Id) = Id + 4 bytes a key in all (Flash: 132). A row of codes alone is Id bytes, so with Id a
multiple of 16 every key's codes start 16-byte aligned and a kernel copies them in 16-byte pieces; rows
holding a key's codes and scale together (Id + 4 bytes) would be 4-byte aligned only.

Scale of a block: the smallest power of two s with amax / s <= 448 (e4m3's largest finite value),
found from amax's fp32 bits (exponent E, mantissa M: 448 = 1.75 * 2^8, so s = 2^(E - 135) when
1 + M / 2^23 <= 1.75, else twice that), exponent clamped to [-126, 126]; an all-zero block gets s = 1.
Values are x / s (exact: s is a power of two) rounded to nearest e4m3, ties to even. Dequantized values
(e4m3 * 2^k, bf16) are exact in bf16 and fp32. The torch functions and the Triton helpers compute the
same bytes: the kernels encode e4m3 with integer bit operations (Triton's interpreter rounds its native
fp8 cast differently), which round like torch's float8_e4m3fn cast, and decode it with the hardware
conversion (exact, so every implementation agrees).
"""

from __future__ import annotations

import torch

from tp_runtime.ops.kernel_support import jit, tl

E4M3_MAX = 448.0
BLOCK = 64  # nope dims per e8m0 scale
KEY_SCALE_BYTES = 4  # one fp32 scale per indexer key, in its own tensor


def row_bytes(dim: int, rope_dim: int) -> int:
    """Bytes of one attention row: Dn e4m3 + 2*Dr bf16 + Dn/64 scales, padded to a multiple of 16."""
    nope = dim - rope_dim
    if nope <= 0 or nope % BLOCK:
        raise ValueError(f"FP8 cache rows need nope dims (head_dim - qk_rope_head_dim = {dim} - {rope_dim} = "
                         f"{nope}) to be a positive multiple of {BLOCK}")
    return -(-(nope + 2 * rope_dim + nope // BLOCK) // 16) * 16


def key_bytes(dim: int) -> int:
    """Bytes of one indexer key: Id e4m3 codes (in the codes tensor) + one fp32 scale (in the scales tensor)."""
    return dim + KEY_SCALE_BYTES


# ---------------------------------------------------------------- torch


def pow2_exponent(amax: torch.Tensor) -> torch.Tensor:
    """k [...] int32 of the smallest power of two 2^k with amax / 2^k <= 448; 0 where amax == 0."""
    bits = amax.float().contiguous().view(torch.int32)
    k = (bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    return torch.where(amax == 0, torch.zeros_like(k), k).clamp(-126, 126)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as fp32 for int32 k in [-126, 127], from the exponent bits (exact)."""
    return ((k.to(torch.int32) + 127) << 23).view(torch.float32)


def _e4m3(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x [..., n] fp32 divided by 2^k [..., 1] (exact), rounded to e4m3 bytes [..., n]."""
    return (x * pow2(-k)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def quantize_rows(x: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Attention rows x [..., D] (any float dtype) -> uint8 [..., row_bytes(D, rope_dim)]."""
    D = x.shape[-1]
    nope, lead = D - rope_dim, x.shape[:-1]
    nb = row_bytes(D, rope_dim)
    blocks = x[..., :nope].float().reshape(*lead, nope // BLOCK, BLOCK)  # [..., Dn/64, 64]
    k = pow2_exponent(blocks.abs().amax(-1))  # [..., Dn/64]
    codes = _e4m3(blocks, k[..., None]).reshape(*lead, nope)
    rope = x[..., nope:].to(torch.bfloat16).contiguous().view(torch.uint8)  # [..., 2*Dr]
    pad = torch.zeros(*lead, nb - nope - 2 * rope_dim - nope // BLOCK, dtype=torch.uint8, device=x.device)
    return torch.cat((codes, rope, (k + 127).to(torch.uint8), pad), dim=-1)


def dequantize_rows(b: torch.Tensor, dim: int, rope_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 rows [..., row_bytes(dim, rope_dim)] -> [..., dim] in dtype (exact for bf16, fp32, fp64)."""
    nope, lead = dim - rope_dim, b.shape[:-1]
    scales = pow2(b[..., nope + 2 * rope_dim: nope + 2 * rope_dim + nope // BLOCK].to(torch.int32) - 127)
    vals = b[..., :nope].contiguous().view(torch.float8_e4m3fn).float().reshape(*lead, nope // BLOCK, BLOCK)
    rope = b[..., nope: nope + 2 * rope_dim].contiguous().view(torch.bfloat16).float()
    return torch.cat(((vals * scales[..., None]).reshape(*lead, nope), rope), dim=-1).to(dtype)


def quantize_keys(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer keys x [..., Id] (any float dtype) -> (codes uint8 [..., Id]: e4m3 values, scales float32 [...]:
    each key's power-of-two scale)."""
    xf = x.float()
    k = pow2_exponent(xf.abs().amax(-1))  # [...]
    return _e4m3(xf, k[..., None]), pow2(k)


def dequantize_keys(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes uint8 [..., Id], scales float32 [...] -> keys [..., Id] in dtype (exact)."""
    return (codes.view(torch.float8_e4m3fn).float() * scales[..., None]).to(dtype)


def round_rows(x: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """What a row becomes once stored and read back (quantize, dequantize), in x's dtype."""
    return dequantize_rows(quantize_rows(x, rope_dim), x.shape[-1], rope_dim, x.dtype)


def round_keys(x: torch.Tensor) -> torch.Tensor:
    """What keys x [..., Id] become once stored and read back (quantize, dequantize), in x's dtype."""
    return dequantize_keys(*quantize_keys(x), x.dtype)


# ---------------------------------------------------------------- Triton helpers (registers <-> bytes)


@jit
def e4m3_encode(x):
    """fp32 values with |x| <= 448 -> e4m3 bytes (int32), rounded to nearest, ties to even."""
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    # normal e4m3 (|x| >= 2^-6): round the 23-bit mantissa to 3 bits (a carry moves the exponent), rebias
    r = a + 0x7FFFF + ((a >> 20) & 1)
    normal = (r >> 20) - (120 << 3)
    # subnormal e4m3: q * 2^-9 with q = |x| * 2^9 rounded; from the 24-bit significand shifted right
    full = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(141 - (a >> 23), 30)
    q = full >> shift
    rem = full & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    sub = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = tl.where(a >= 0x3C800000, normal, sub)
    return tl.where(bits < 0, code | 128, code)


@jit
def pow2_exp(amax):
    """fp32 amax >= 0 -> int32 k of the smallest 2^k with amax / 2^k <= 448 (0 for a zero amax)."""
    bits = amax.to(tl.int32, bitcast=True)
    k = (bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    k = tl.where(amax == 0.0, 0, k)
    return tl.minimum(tl.maximum(k, -126), 126)


@jit
def exp2_int(k):
    """2^k as fp32 for int32 k in [-126, 127] (exact)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@jit
def fp16_exponent(amax):
    """e (int32) such that amax * 2^-e lies in [2^14, 2^15) for fp32 amax > 0 (floor(log2(amax)) - 14, clamped to
    [-126, 126]); 0 for amax 0. A 16-bit q whose largest |element| is amax, times 2^-e, fits fp16 (the indexer's
    dot over FP8 key codes widened to fp16)."""
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 141
    return tl.where(amax == 0.0, 0, tl.minimum(tl.maximum(e, -126), 126))


@jit
def bf16_bits(x):
    """fp32 -> the 16 bits of its bf16 rounding (nearest, ties to even), int32 in [0, 65536)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


@jit
def load_rows(ptr, d, ok, DN: tl.constexpr, DR: tl.constexpr, DTYPE: tl.constexpr, D0=0, ROPE: tl.constexpr = True):
    """Attention rows read in place: ptr [N] uint8 pointers to rows (16-byte aligned: row_bytes pads to 16),
    d = D0 + arange(BLOCK_D) dims (D0 a multiple of 64: 0, or the start of a row's upper dims), ok [N] rows to
    read -> [N, BLOCK_D] in DTYPE (bf16 or fp32; zero where not ok or d >= DN + DR). Exact: e4m3 values
    times a power of two, and bf16 rope dims, are exact in both.

    The nope bytes and the rope dims load as vectors (16 bytes / 8 bf16 a load), e4m3 decodes by the
    hardware conversion, and each row's scale bytes of these dims load once and are broadcast over their 64
    dims; decoding straight to bf16 keeps half the registers of an fp32 tile. ROPE False: the caller knows d
    holds no rope dim (d < DN), and their load is left out."""
    N: tl.constexpr = ptr.shape[0]
    BLOCK_D: tl.constexpr = d.shape[0]
    G: tl.constexpr = BLOCK_D // 64
    p = ptr[:, None]
    is_nope = (d < DN)[None, :]
    codes = tl.load(p + d[None, :], mask=ok[:, None] & is_nope, other=0)  # [N, BLOCK_D] uint8
    nope = codes.to(tl.float8e4nv, bitcast=True).to(DTYPE)
    g = D0 // 64 + tl.arange(0, G)  # the scale groups of these dims
    sc = tl.load(p + (DN + 2 * DR) + g[None, :], mask=ok[:, None] & (g < DN // 64)[None, :], other=127)
    scale = exp2_int(sc.to(tl.int32) - 127).to(DTYPE)  # [N, G]: 1 for groups past the nope dims
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (N, G, 64)), (N, BLOCK_D))
    if not ROPE:
        return nope * scale
    rp = (ptr + DN).to(tl.pointer_type(tl.uint16))[:, None]  # bf16 rope dims at byte DN (DN % 64 == 0)
    rm = ok[:, None] & ((d >= DN) & (d < DN + DR))[None, :]
    bits = tl.load(rp + (d[None, :] - DN), mask=rm, other=0).to(tl.int32)  # fp32 = bf16 bits << 16, exact
    rope = (bits << 16).to(tl.float32, bitcast=True).to(DTYPE)
    return tl.where(is_nope, nope * scale, rope)


@jit
def store_row(ptr, y, DN: tl.constexpr, DR: tl.constexpr, BLOCK_D: tl.constexpr, NB: tl.constexpr):
    """One attention row y [BLOCK_D] fp32 (dims >= DN + DR ignored) into NB bytes at uint8 pointer ptr."""
    d = tl.arange(0, BLOCK_D)
    blocks = tl.reshape(tl.where(d < DN, y, 0.0), (BLOCK_D // 64, 64))
    k = pow2_exp(tl.max(tl.abs(blocks), axis=1))  # [BLOCK_D / 64]; blocks past DN/64 are unused
    scaled = tl.reshape(blocks * exp2_int(-k)[:, None], (BLOCK_D,))
    codes = e4m3_encode(tl.minimum(tl.maximum(scaled, -448.0), 448.0))
    tl.store(ptr + d, codes.to(tl.uint8), mask=d < DN)
    rd = tl.maximum(d - DN, 0)
    rm = (d >= DN) & (d < DN + DR)
    bf = bf16_bits(y)
    tl.store(ptr + DN + 2 * rd, (bf & 255).to(tl.uint8), mask=rm)
    tl.store(ptr + DN + 2 * rd + 1, (bf >> 8).to(tl.uint8), mask=rm)
    g = tl.arange(0, BLOCK_D // 64)
    tl.store(ptr + DN + 2 * DR + g, (k + 127).to(tl.uint8), mask=g < DN // 64)
    tail = DN + 2 * DR + DN // 64 + tl.arange(0, 16)  # zero padding
    tl.store(ptr + tail, tl.zeros([16], tl.int32).to(tl.uint8), mask=tail < NB)


@jit
def load_keys(ptr, scale_ptr, d, ok, ID: tl.constexpr):
    """Indexer keys read in place: ptr [N] uint8 pointers to rows of Id codes (16-byte aligned where Id is a
    multiple of 16; the caller promises it with tl.multiple_of), scale_ptr [N] fp32 pointers to their scales,
    d [BLOCK_D], ok [N] -> [N, BLOCK_D] fp32, zero where not ok or d >= ID. Vector loads of the codes, the
    hardware e4m3 conversion (exact) and one fp32 scale load a key."""
    codes = tl.load(ptr[:, None] + d[None, :], mask=ok[:, None] & (d < ID)[None, :], other=0)
    scale = tl.load(scale_ptr, mask=ok, other=0.0)  # [N]
    return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, None]


@jit
def load_key_codes(ptr, d, ok, ID: tl.constexpr):
    """The e4m3 codes of indexer keys read in place, left encoded (load_keys' code pointers and masks) ->
    [N, BLOCK_D] tl.float8e4nv, zero where not ok or d >= ID: what an FP8 dot takes (a key is these times its
    scale). Loaded through an e4m3 pointer, not as bytes bit-cast after the load, so that the compiler's async
    copy writes them straight into the MMA's shared-memory operand (a cast between would route them through
    registers)."""
    cp = ptr.to(tl.pointer_type(tl.float8e4nv))[:, None] + d[None, :]
    return tl.load(cp, mask=ok[:, None] & (d < ID)[None, :], other=0.0)


@jit
def quantize_vectors(x):
    """x [M, BLOCK_D] (zero past the vector's dims) -> (e4m3 codes [M, BLOCK_D] as tl.float8e4nv, exponents k
    [M] int32): each row divided by its power-of-two scale 2^k and rounded as store_key rounds a key (the codes
    and scale of quantize_keys, bit for bit); a row is codes * 2^k."""
    xf = x.to(tl.float32)
    k = pow2_exp(tl.max(tl.abs(xf), axis=1))  # [M]
    codes = e4m3_encode(tl.minimum(tl.maximum(xf * exp2_int(-k)[:, None], -448.0), 448.0))
    return codes.to(tl.uint8).to(tl.float8e4nv, bitcast=True), k


@jit
def store_key(ptr, scale_ptr, y, ID: tl.constexpr, BLOCK_D: tl.constexpr):
    """One indexer key y [BLOCK_D] fp32 (dims >= ID ignored): its ID e4m3 codes at uint8 pointer ptr, its
    power-of-two scale at fp32 pointer scale_ptr (one fp32 store)."""
    d = tl.arange(0, BLOCK_D)
    y = tl.where(d < ID, y, 0.0)
    k = pow2_exp(tl.max(tl.abs(y), axis=0))
    codes = e4m3_encode(tl.minimum(tl.maximum(y * exp2_int(-k), -448.0), 448.0))
    tl.store(ptr + d, codes.to(tl.uint8), mask=d < ID)
    tl.store(scale_ptr, exp2_int(k))
