"""Gluon (Triton's dialect with explicit layouts): the indexer's score kernel for FP8 keys and a 16-bit q on Hopper
(ops/indexer_topk.py's `_score_kernel` with CODES16, its bins, without the fused select; same scores up to the
order of the fp32 sums).

For token t and key s < n[t] = min(n_valid[t], n_keys):

    I[t, s] = scale * ks[s] * sum_h w16[h] * relu(q16[h] . codes[s])

q16, w16: q in fp16 and w, each head scaled by a power of two and its inverse (indexer_topk's `_fp16_q`, so the
dot over the codes widened to fp16 is the decoded keys' dot, scaled); ks the key's power-of-two scale.

Why a second kernel: the Triton kernel copies a block's codes into shared memory in 8-byte pieces and reads them
back two bytes at a time into the MMA's A fragments (32 LDS.U16 a thread a block): about 300 instructions a thread
per 64 keys, and its q loads two bytes at a time too. Here a thread copies (16-byte async copies) and reads back
(four LDS.128) just the 32 bytes a row its own A fragments need: 233 instructions a block (offline sm_90 compile)
and, at batch 128 / 32K on an H200, 56.0 us against 63-69 for the Triton kernel alone, score + top-K 91.7 against
103.6 us (results/h200-2026-12-04-indexer-wgmma-scores).

That works because the dot does not depend on the order of its K dimension, only on q and the keys sharing it.
Thread t (t = lane % 4) of an m64nNk16 warpgroup MMA holds, of each row and each 16-wide K block kb, columns
kb * 16 + {2t, 2t + 1, 2t + 8, 2t + 9}. The kernel gives logical column

    c = kb * 16 + half * 8 + 2t + pair      the code at byte  m(c) = 32t + 4kb + 2half + pair

of the key row: thread t's columns over the 8 blocks are the row's bytes 32t .. 32t + 31, the words 8t .. 8t + 7.
q's columns are relabeled the same way, so each product of the dot is one of the key-order dot's. The codes move
as int32 words (`WORDS_L`: rows x words); each word widens to four fp16 with two cvt.f16x2.e4m3x2 (`_widen`), a
reshape and a permute relabel bytes as columns (`_to_mma_columns`: no data moves), and the conversion into the
MMA's operand layout renames registers only (no shared memory, no shuffle: offline SASS). Each thread reads back
only what it copied, so the copies need no barrier of their own. The key scales load in registers as their
codes are copied (a scale loaded one block ahead was still in flight when its block was scored: Nsight Compute).

PDL as the Triton kernel: wait before the first load, trigger after the run's last block of keys is loaded.
On installs without Gluon this module still imports; its kernel cannot run.
"""

from __future__ import annotations

import operator

import torch

from tp_runtime.ops.cache_fp8 import exp2_int, fp16_exponent
from tp_runtime.ops.kernel_support import gjit, gl, gl_const, gl_pdl_trigger, gl_pdl_wait, gluon_hopper

try:
    from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma
except ImportError:
    pass

HEADS = gl_const(64)  # the MMA's N: indexer heads, zero-padded up to it
DIMS = gl_const(128)  # the MMA's K: the indexer head dim the layout is written for
ROWS = gl_const(64)  # keys a block: the MMA's M (one warpgroup)

if gl is not None:
    # the accumulator [ROWS keys, HEADS heads]: one warpgroup, each warp 16 keys
    ACC_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
    A_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC_L.value, k_width=2))  # the keys, fp16
    # code words [ROWS, DIMS // 4] int32 (word w = 8t + kb of a row holds its bytes 32t + 4kb .. + 3): registers kb
    # (words 1, 2, 4), then row + 8; lanes t (words 8, 16) and rows 1, 2, 4; warps rows 16, 32: A_L's rows and the
    # words of its K blocks
    WORDS_L = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]], lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 32]))
    # the ring of code words: 16-byte groups swizzled by row, so that a warp's reads (8 rows x 4 threads' groups)
    # hit every bank once a wavefront
    RING_SL = gl.constexpr(gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))


def codes_wgmma_fits(device: torch.device, n_heads: int, head_dim: int, q_dtype: torch.dtype) -> bool:
    """The kernel can run on `device` (`gluon_hopper`) and covers this indexer: DIMS-dim keys, at most HEADS heads,
    a 16-bit q (FP8 keys are the caller's condition)."""
    return (gluon_hopper(device) and head_dim == DIMS and n_heads <= HEADS
            and q_dtype in (torch.bfloat16, torch.float16))


@gjit
def _to_mma_columns(x):
    # x [R, DIMS] in row-byte order -> the same values with logical column kb * 16 + half * 8 + 2t + pair for byte
    # 32t + 4kb + 2half + pair (the module docstring's order): a relabeling, no data moves
    R: gl.constexpr = x.shape[0]
    x = gl.permute(gl.reshape(x, [R, 4, 8, 2, 2]), (0, 2, 3, 1, 4))  # [row, kb, half, t, pair]
    return gl.reshape(x, [R, DIMS])


@gjit
def _q16_smem(q_ptr, sq_t, sq_h, w_ptr, sw_t, t, IH: gl.constexpr):
    """Token t's q [HEADS, DIMS] (columns in the MMA's order) in fp16, each head times 2^-e[h], which puts its
    largest |q| in [2^14, 2^15), into shared memory for the MMA's B; and w [HEADS] fp32 times 2^e[h] in the
    accumulator's column layout (zero past IH)."""
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # 16-byte loads
    h = gl.arange(0, HEADS, layout=gl.SliceLayout(1, q_l))
    d = gl.arange(0, DIMS, layout=gl.SliceLayout(0, q_l))
    q = gl.load(q_ptr + t * sq_t + h[:, None] * sq_h + d[None, :], mask=(h < IH)[:, None], other=0.0)
    qf = q.to(gl.float32)
    if q.dtype == gl.float16:
        e = gl.zeros([HEADS], gl.int32, gl.SliceLayout(1, q_l))
    else:
        e = fp16_exponent(gl.max(gl.abs(qf), axis=1))  # [HEADS]
    q16 = _to_mma_columns((qf * exp2_int(-e)[:, None]).to(gl.float16))
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEADS, DIMS], gl.float16)
    q_smem = gl.allocate_shared_memory(gl.float16, [HEADS, DIMS], q_sl, q16)
    hw = gl.arange(0, HEADS, layout=gl.SliceLayout(0, ACC_L))
    w = gl.load(w_ptr + t * sw_t + hw, mask=hw < IH, other=0.0).to(gl.float32)
    ew = gl.convert_layout(e, gl.SliceLayout(0, ACC_L))
    return q_smem, w * exp2_int(ew)


@gjit
def _copy_block(dst, base, sk_w, b0, end):
    # block b0's code words into dst [ROWS, DIMS // 4] int32, 16-byte async copies in WORDS_L (each thread copies the
    # words it reads back: no barrier between) and zeros at and past end (no bytes read); one copy group.
    # base: the token's codes as int32, sk_w their row stride in words
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, WORDS_L))
    w = gl.arange(0, DIMS // 4, layout=gl.SliceLayout(0, WORDS_L))
    async_copy.async_copy_global_to_shared(dst, base + (b0 + r).to(gl.int64)[:, None] * sk_w + w[None, :],
                                           mask=(b0 + r < end)[:, None])
    async_copy.commit_group()


@gjit
def _key_scales(ks_base, b0, end):
    # block b0's key scales [ROWS] fp32 in the accumulator's row layout (zeros at and past end)
    s = b0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ACC_L))
    return gl.load(ks_base + s, mask=s < end, other=0.0)


@gjit
def _widen(words):
    # code words [ROWS, 32] int32 -> the keys [ROWS, DIMS] fp16 (exact) in A_L, logical column kb * 16 + half * 8 +
    # 2t + pair from byte 2 * half + pair of word 8t + kb: two cvt.f16x2.e4m3x2 a word, whose halves stay packed
    b0, b1, b2, b3 = gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 a, b; mov.b32 {lo, hi}, $4; cvt.rn.f16x2.e4m3x2 a, lo; "
        "cvt.rn.f16x2.e4m3x2 b, hi; mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; }",
        "=h,=h,=h,=h,r", [words], dtype=(gl.float16, gl.float16, gl.float16, gl.float16), is_pure=True, pack=1)
    k = gl.join(gl.join(b0, b2), gl.join(b1, b3))  # [ROWS, 32, half, pair]: row-byte order
    return gl.convert_layout(_to_mma_columns(gl.reshape(k, [ROWS, DIMS])), A_L)


@gjit
def _block_scores(codes, ks, q_smem, w, scale):
    # sum_h w[h] * relu(q16[h] . codes[n]) * ks[n] * scale [ROWS] (SliceLayout(1, ACC_L)) of one block's codes
    zero = gl.zeros([ROWS, HEADS], gl.float32, ACC_L)
    acc = warpgroup_mma(_widen(codes), q_smem.permute((1, 0)), zero, use_acc=False)  # [ROWS, HEADS]
    return gl.sum(gl.maximum(acc, 0.0) * w[None, :], axis=1) * ks * scale


@gjit
def _codes_score_kernel(
    q_ptr, sq_t, sq_h,  # q [T, Ih, 128] bf16 / fp16, last dim contiguous
    w_ptr, sw_t,  # w [T, Ih]
    k_ptr, sk_slot, sk_row,  # key codes [slots, N, 128] uint8 (e4m3), last dim contiguous, rows 16-byte aligned
    ks_ptr, sks_slot,  # key scales [slots, N] fp32, last dim contiguous
    slot_ptr, nv_ptr,  # [T] long each
    score_ptr, s_score,  # scratch [T, n_keys] fp32
    hist_ptr, s_hist,  # BINS: zeroed [T, >= 2^HI_BITS + 1] int32, the first digit's bins
    n_keys, scale,
    IH: gl.constexpr, BLOCKS: gl.constexpr, STAGES: gl.constexpr, BINS: gl.constexpr, BINS_FROM: gl.constexpr,
    HI_BITS: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr,
):
    # grid (T, runs of BLOCKS blocks): one run of a token's keys a program, through a ring of STAGES (2-4) blocks
    # (STAGES - 1 in flight while one is scored)
    t = gl.program_id(0)
    start = gl.program_id(1) * (ROWS * BLOCKS)
    gl_pdl_wait(PDL)
    n = gl.minimum(gl.load(nv_ptr + t), n_keys).to(gl.int32)
    if start < n:
        end = gl.minimum(start + ROWS * BLOCKS, n)
        slot = gl.load(slot_ptr + t)
        base = (k_ptr + slot * sk_slot).to(gl.pointer_type(gl.int32))  # the token's code rows as words
        ks_base = ks_ptr + slot * sks_slot
        sk_w = sk_row // 4
        ring = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, DIMS // 4], RING_SL)
        for j in gl.static_range(STAGES - 1):
            _copy_block(ring.index(j), base, sk_w, start + j * ROWS, end)
        # the key scales of blocks i .. i + 3 in registers (loaded as their codes are copied: a scale loaded one
        # block ahead was still in flight when its block was scored)
        ks0 = _key_scales(ks_base, start, end)
        ks1 = _key_scales(ks_base, start + ROWS, end)
        ks2 = _key_scales(ks_base, start + 2 * ROWS, end)
        ks3 = _key_scales(ks_base, start + 3 * ROWS, end)
        q_smem, w = _q16_smem(q_ptr, sq_t, sq_h, w_ptr, sw_t, t, IH)
        fence_async_shared()
        gl.thread_barrier()  # q whole in shared memory before the MMAs read it
        for b0 in range(start, end, ROWS):
            i = (b0 - start) // ROWS
            _copy_block(ring.index((i + STAGES - 1) % STAGES), base, sk_w, b0 + (STAGES - 1) * ROWS, end)
            ks4 = _key_scales(ks_base, b0 + 4 * ROWS, end)
            async_copy.wait_group(STAGES - 1)  # this thread's copies of block i have landed
            score = _block_scores(ring.index(i % STAGES).load(WORDS_L), ks0, q_smem, w, scale)
            ks0, ks1, ks2, ks3 = ks1, ks2, ks3, ks4
            s = b0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ACC_L))
            km = s < end
            gl.store(score_ptr + t * s_score + s, score, mask=km)
            if BINS:
                _count_digits(hist_ptr + t * s_hist, score, km, n, BINS_FROM, HI_BITS)
        gl_pdl_trigger(PDL)


@gjit
def _count_digits(hist_row, score, km, n, BINS_FROM: gl.constexpr, HI_BITS: gl.constexpr):
    # the first digit (top HI_BITS bits) of the scores' order-preserving keys (topk_select.order_key) counted into
    # the token's bins hist_row (int32), for its valid keys (km) where it has more than BINS_FROM (n); integer adds:
    # any order, the same counts
    b = gl.where(score == 0.0, 0.0, score).to(gl.int32, bitcast=True)
    b = gl.where(b < 0, b ^ 0x7FFFFFFF, b)
    digit = (b >> (32 - HI_BITS)) + (1 << (HI_BITS - 1))  # (b + 2^31) >> (32 - HI_BITS)
    one = gl.full(score.shape, 1, gl.int32, score.type.layout)
    gl.atomic_add(hist_row + digit, one, mask=km & (n > BINS_FROM), sem="relaxed")


def codes_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, key_scales: torch.Tensor, slot: torch.Tensor,
                 n_valid: torch.Tensor, scores: torch.Tensor, scale: float, blocks: int, stages: int, pdl: bool,
                 hist: torch.Tensor | None = None, bins_from: int = 0, hi_bits: int = 12, regs: int = 0) -> None:
    """The scores into scores [T, n_keys] (written for s < min(n_valid[t], n_keys)); q [T, Ih, 128] 16-bit, w [T, Ih],
    keys uint8 e4m3 codes [slots, N, 128] with key_scales fp32 [slots, N]; runs of `blocks` blocks of 64 keys a
    program through a ring of `stages` blocks; with hist (zeroed [T, 2^hi_bits + 1] int32) the first digit's bins of the
    tokens with more than bins_from keys; regs: ptxas's maxnreg (0: the compiler's choice)."""
    T, ih, idim = q.shape
    n_keys = scores.shape[1]
    assert idim == DIMS and ih <= HEADS and q.stride(2) == 1 and keys.stride(2) == 1 and key_scales.stride(1) == 1
    assert keys.stride(0) % 16 == 0 and keys.stride(1) % 16 == 0, "code rows must be 16-byte aligned"
    bins = hist is not None
    hist = hist if bins else scores  # not read without bins
    _codes_score_kernel[(T, -(-n_keys // (operator.index(ROWS) * blocks)))](
        q, q.stride(0), q.stride(1), w, w.stride(0), keys, keys.stride(0), keys.stride(1),
        key_scales, key_scales.stride(0), slot, n_valid, scores, scores.stride(0), hist, hist.stride(0),
        n_keys, scale, IH=ih, BLOCKS=blocks, STAGES=stages, BINS=bins, BINS_FROM=bins_from, HI_BITS=hi_bits, PDL=pdl,
        num_warps=4, launch_pdl=pdl, **({"maxnreg": regs} if regs else {}))
