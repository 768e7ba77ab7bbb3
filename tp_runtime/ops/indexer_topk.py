"""Indexer scores and top-K selection over the compressed keys, in the kernel (Triton).

Same function as `torch_path.indexer_topk`: for token t with n[t] = min(n_valid[t], n_keys) keys,

    I[t, s] = Id^-0.5 * Ih^-0.5 * sum_h w[t, h] * relu(q[t, h] . keys[slot[t], s]),   s < n[t]

and the K largest, ties to the lower index, -1 where fewer than K exist. `_score_kernel`, grid (T, runs of
key blocks): a run of blocks of one token's keys per program (its q and w loaded once for the run), fp32
scores into a scratch row; a block at or past n[t] (read from device memory) is not read, and a program
whose run starts there returns at once. With bins (the "split" and "fused" selects) its programs add their
scores, as they store them, into the token's bins of the first digit of the scores' order-preserving keys
(the top HI_BITS = 12 bits: 4096 bins, so that scores of one binade still spread over 8 bins; relaxed
atomics into [T, 4096] int32, zeroed by a memset captured with the kernels), for tokens with more than
BINS_FROM keys. The selects are ops/topk_select.py's (config.select; `topk_config` picks "split", which
walks a long context's scores in runs over several programs a token); "fused" runs in this kernel: each
program counts itself in after its run (an acq_rel atomic after a barrier) and the token's last program to
count in (run 0 always, for n = 0) selects, while other tokens' programs still score.
On Hopper, FP8 keys with a 16-bit q take the Gluon score kernel of ops/indexer_scores_wgmma.py instead
(`topk_config`'s wgmma, TopkConfig.score_kernel; with the bins, not with the fused select): the scores below
up to the order of the fp32 sums of each dot.

With FP8 keys (ops/cache_fp8.py: codes uint8 [slots, N, Id] and key_scales fp32 [slots, N], one power-of-two
scale per key) the score kernel reads the codes in place through 16-byte-aligned row pointers (with Id a
multiple of 16: the host computes the alignment from the code rows' strides, `row_align`, and the kernel
promises it with tl.multiple_of, so the codes copy in 16-byte pieces) and the scales through a plain fp32
pointer. With a 16-bit q the dot takes the codes widened to fp16 in registers (one conversion per two codes,
exact), q in fp16 (bf16 q times a power of two per head that puts its largest element in fp16's range, the
head's weight times its inverse), and each key's scale multiplies its score (`_code_scores`): as every scale
is a power of two, the scores are those of the decoded keys in q's dtype, bit for bit, where a head's elements
lie within 2^28 of its largest. Decoding to bf16 (through fp32, times the scale: six instructions per two
codes) made the kernel issue-bound: H200, batch 128 / 32K, 2.0 TB/s against 3.9 with bf16 keys
(results/h200-2026-12-03-indexer-fp16-codes). An fp32 q takes the keys decoded in registers (exact).

q_fp8 (runtime.indexer_q=e4m3, as DeepSeek's and vLLM's indexers): the score is that of q rounded as a key is
stored, each head's q[t, h] to e4m3 with one power-of-two scale qs[h] (cache_fp8's rule and integer-exact
helpers, so the interpreter, the GPU and `cache_fp8.round_keys` agree bit for bit), rounded once a program
(`_round_q`). With keys in q's dtype the rounded q (exact there) takes the same dot as an unrounded one.
With FP8 keys both sides are e4m3: as the scales are positive, relu(qs * ks * dot) = qs * ks * relu(dot), so
the kernel runs the FP8 dot of q's codes [BLOCK_H, Id] and the key codes [BLOCK_N, Id] as stored (loaded
through an e4m3 pointer: the async copies write them into the MMA's shared-memory operand, K-major as the
FP8 MMA needs its B; no decode in registers) with fp32 accumulation (on sm_90 wgmma e4m3 at Flash dims;
below 64 heads a block, Triton's MMA v2 path, which widens both to f16 in registers: exact too), and

    score[n] = ks[n] * sum_h (w[h] * qs[h]) * relu(dot[h, n]) * scale.

The keys' scales of a program's run load once, from key_scales, before its loop ([BLOCKS_P2, BLOCK_N]: only
a dot's operands are copied ahead asynchronously). Products of two e4m3 values are exact in fp32, so this
differs from the decoded fp32 dot only by the accumulation: in order of summation, and on Hopper in precision
(the FP8 MMA adds its Id products into an accumulator narrower than fp32, about 14 bits as DeepSeek-V3's
report measured; tests/test_fp8_cache_gpu.py states the bound it is held to).
Picks may then differ from the torch path's only where two scores lie within that bound of each other.
Triton's interpreter runs the FP8 dot on the decoded values with fp32 sums.

The picks of a token come packed: valid indices first, then -1 (the sparse attention kernel relies on
it). Their order differs from the torch path's (by score there; here index order ("radix", "regs"), or
the keys of higher first-digit bins by index, then those of the threshold bin); the sets are the same.
-0.0 and +0.0 count as equal, as in torch's sort.

PDL (ops/kernel_support.py): every kernel waits before its first load (the token's key count, then q,
w and the keys: the step's metadata, the indexer's projections and the compressor's cache writes). The
score kernel triggers after its run's last block of keys (fused: before counting itself in, as no
later load reads another kernel's output); the select kernels as ops/topk_select.py says.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.cache_fp8 import exp2_int, fp16_exponent, load_key_codes, load_keys, quantize_vectors
from tp_runtime.ops.indexer_scores_wgmma import codes_scores, codes_wgmma_fits
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, row_align, sm_count, tl, triton
from tp_runtime.ops.topk_select import (RANK_N, order_key, radix_select_kernel, regs_select_kernel,
                                        select_token, split_hist_width, split_select_kernel)


@jit
def _score_kernel(
    q_ptr, sq_t, sq_h,  # q [T, Ih, Id], last dim contiguous
    w_ptr, sw_t,  # w [T, Ih]
    k_ptr, sk_slot, sk_row,  # keys [slots, N, Id], last dim contiguous (FP8: uint8 e4m3 codes)
    ks_ptr, sks_slot,  # FP8: key scales [slots, N] fp32, last dim contiguous
    slot_ptr, nv_ptr,  # [T] long each
    score_ptr, s_score,  # scratch [T, n_keys] fp32
    hist_ptr, s_hist,  # BINS: zeroed scratch [T, >= 2^HI_BITS + 1] int32 (the first digit's bins, then arrivals)
    cand_ptr, s_cand,  # FUSED: scratch [T, n_keys] int32 (indices of the first digit's threshold bin)
    out_ptr, s_out,  # FUSED: [T, K] long
    n_keys, K, scale,
    IH: tl.constexpr, ID: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr,
    CODES16: tl.constexpr, Q_FP8: tl.constexpr, ROW_ALIGN: tl.constexpr, BINS: tl.constexpr, BINS_FROM: tl.constexpr,
    FUSED: tl.constexpr, HI_BITS: tl.constexpr, LO_BITS: tl.constexpr,
    LO_PASSES: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    t = tl.program_id(0)
    run = tl.program_id(1)
    start = run * (BLOCK_N * BLOCKS)  # this program's BLOCKS blocks of keys
    pdl_wait(PDL)
    n = tl.minimum(tl.load(nv_ptr + t), n_keys).to(tl.int32)
    if start < n:
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        qm = (h < IH)[:, None] & (d < ID)[None, :]
        q = tl.load(q_ptr + t * sq_t + h[:, None] * sq_h + d[None, :], mask=qm, other=0.0)  # [BLOCK_H, BLOCK_D]
        w = tl.load(w_ptr + t * sw_t + h, mask=h < IH, other=0.0).to(tl.float32)  # [BLOCK_H]
        if Q_FP8:  # runtime.indexer_q=e4m3: each head's q rounded once for the run (FP8 keys: q becomes codes)
            q, w = _round_q(q, w, FP8)
        elif CODES16:  # FP8 keys, 16-bit q: the dot takes the keys' codes widened to fp16, and q in fp16
            q, w = _fp16_q(q, w)
        slot = tl.load(slot_ptr + t)
        base = k_ptr + slot * sk_slot
        scale_base = ks_ptr + slot * sks_slot  # FP8: the token's key scales
        if FP8 and Q_FP8:  # the run's key scales, loaded once: the loop's only loads are the key codes
            run_scales = _run_key_scales(scale_base, start, n, BLOCKS, BLOCKS_P2, BLOCK_N)
        for b0 in range(start, tl.minimum(start + BLOCK_N * BLOCKS, n), BLOCK_N):
            s = b0 + tl.arange(0, BLOCK_N)
            km = s < n
            row = base + tl.multiple_of(s.to(tl.int64) * sk_row, ROW_ALIGN)  # [BLOCK_N] row pointers
            if FP8 and Q_FP8:
                k_scale = _block_row(run_scales, (b0 - start) // BLOCK_N)  # [BLOCK_N]
                score = _fp8_dot_scores(q, w, row, d, km, ID) * k_scale * scale  # [BLOCK_N]
            elif CODES16:
                score = _code_scores(q, w, row, scale_base + s, d, km, ID) * scale  # [BLOCK_N]
            else:
                score = _dot_scores(q, w, row, scale_base + s, d, km, ID, FP8, PRECISION) * scale  # [BLOCK_N]
            tl.store(score_ptr + t * s_score + s, score, mask=km)
            if BINS:  # the first digit's histogram, as the scores come (integer adds: any order, same counts)
                digit = (order_key(score) >> (32 - HI_BITS)).to(tl.int32)
                tl.atomic_add(hist_ptr + t * s_hist + digit, 1, mask=km & (n > BINS_FROM), sem="relaxed")
        if not FUSED:
            pdl_trigger(PDL)
    if FUSED:
        # The token's last program to arrive (its run's scores and bins stored before the count's release;
        # the acquire makes every other program's visible) selects; programs past n never started, so
        # cdiv(n, run length) arrive (run 0 always: it writes the picks of an empty token too).
        if (start < n) | (run == 0):
            pdl_trigger(PDL)
            tl.debug_barrier()  # every thread's stores of this program before the release
            arrivals = tl.maximum(tl.cdiv(n, BLOCK_N * BLOCKS), 1)
            if tl.atomic_add(hist_ptr + t * s_hist + (1 << HI_BITS), 1, sem="acq_rel") == arrivals - 1:
                select_token(score_ptr + t * s_score, hist_ptr + t * s_hist, cand_ptr + t * s_cand,
                              out_ptr + t * s_out, n, K, HI_BITS, LO_BITS, LO_PASSES, CHUNK)


@jit
def _round_q(q, w, FP8: tl.constexpr):
    """q [BLOCK_H, BLOCK_D] with each head's vector rounded as cache_fp8.quantize_keys rounds a key (one
    power-of-two scale qs per head, values to nearest e4m3), and w [BLOCK_H] fp32 -> FP8 keys: (the e4m3
    codes, w * qs), as the scales are positive and relu(qs * ks * dot) = qs * ks * relu(dot); else: (the
    rounded q in q's dtype, exact, w)."""
    codes, k = quantize_vectors(q)  # [BLOCK_H, BLOCK_D] e4m3, [BLOCK_H] int32
    if FP8:
        q, w = codes, w * exp2_int(k)
    else:
        q = (codes.to(tl.float32) * exp2_int(k)[:, None]).to(q.dtype)
    return q, w


@jit
def _dot_scores(q, w, row, key_scale, d, km, ID: tl.constexpr, FP8: tl.constexpr, PRECISION: tl.constexpr):
    """sum_h w[h] * relu(q[h] . key[n]) [BLOCK_N] for the keys at row pointers row [BLOCK_N] (km: valid), in
    q's dtype on the tensor cores; FP8 keys (row: pointers to their codes, key_scale [BLOCK_N]: fp32 pointers
    to their scales) decoded in registers (e4m3 times the key's scale: exact).

    The keys are the product's first operand (logits [BLOCK_N, BLOCK_H] = keys . q^T): on Hopper its MMA takes
    them from registers, so decoded FP8 keys feed it without a trip through shared memory, and a key's heads
    lie in one warp, so the weighted sum over heads needs no exchange between warps (with the keys second,
    both cost shared memory and barriers every block: 107 against 77 us a layer at batch 128 / 32K with FP8
    keys, 93 against 83 with bf16 keys; results/h200-2026-12-03-fp8-rows-keys)."""
    if FP8:
        k = load_keys(row, key_scale, d, km, ID).to(q.dtype)
    else:
        k = tl.load(row[:, None] + d[None, :], mask=km[:, None] & (d < ID)[None, :], other=0.0)
    logits = tl.maximum(tl.dot(k, tl.trans(q), input_precision=PRECISION), 0.0)  # [BLOCK_N, BLOCK_H]
    return tl.sum(logits * w[None, :], axis=1)


@jit
def _fp16_q(q, w):
    """q [BLOCK_H, BLOCK_D] bf16 or fp16, w [BLOCK_H] -> (q in fp16, w fp32) with the same weighted relu sums
    over codes (`_code_scores`). bf16: each head's q times 2^-e[h], which puts its largest |q| in [2^14, 2^15),
    and w times 2^e[h]. Exact where a head's elements lie within 2^28 of its largest (fp16's normal range;
    smaller ones keep fp16's subnormal precision): as the scales are powers of two, every product and partial
    sum of the dot and of the weighted sum is the decoded path's, scaled."""
    if q.dtype == tl.float16:
        return q, w
    qf = q.to(tl.float32)
    e = fp16_exponent(tl.max(tl.abs(qf), axis=1))  # [BLOCK_H]
    return (qf * exp2_int(-e)[:, None]).to(tl.float16), w * exp2_int(e)


@jit
def _code_scores(q16, w, row, key_scale, d, km, ID: tl.constexpr):
    """sum_h w[h] * relu(q16[h] . key[n]) [BLOCK_N] for FP8 keys at row pointers row [BLOCK_N] (their e4m3 codes;
    key_scale [BLOCK_N]: fp32 pointers to their power-of-two scales), q16 [BLOCK_H, BLOCK_D] fp16 (`_fp16_q`):
    the codes widened to fp16 (one conversion per two, exact) feed the dot, and each key's scale multiplies its
    sum (relu(ks * x) = ks * relu(x), ks > 0 a power of two: the decoded path's value). Widening to fp16
    costs one instruction per two codes where decoding to bf16 took six (through fp32, times the scale)."""
    codes = tl.load(row[:, None] + d[None, :], mask=km[:, None] & (d < ID)[None, :], other=0)  # uint8
    k = codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)  # [BLOCK_N, BLOCK_D]
    logits = tl.maximum(tl.dot(k, tl.trans(q16)), 0.0)  # [BLOCK_N, BLOCK_H]
    return tl.sum(logits * w[None, :], axis=1) * tl.load(key_scale, mask=km, other=0.0)


@jit
def _fp8_dot_scores(q_codes, w, row, d, km, ID: tl.constexpr):
    """sum_h w[h] * relu(q_codes[h] . codes[n]) [BLOCK_N]: the FP8 dot of the e4m3 q codes [BLOCK_H, BLOCK_D]
    and the keys' e4m3 codes at row pointers row [BLOCK_N] as stored (no decode in registers: the async copies
    feed the MMA), fp32 accumulation. Times each key's scale, the score of the rounded q and key."""
    k_codes = load_key_codes(row, d, km, ID)  # [BLOCK_N, BLOCK_D] e4m3 (K-major: the MMA's B as it needs it)
    logits = tl.maximum(tl.dot(q_codes, tl.trans(k_codes), out_dtype=tl.float32), 0.0)  # [BLOCK_H, BLOCK_N]
    return tl.sum(logits * w[:, None], axis=0)


@jit
def _run_key_scales(scale_base, start, n, BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, BLOCK_N: tl.constexpr):
    """The fp32 scales of a run's FP8 keys [BLOCKS_P2, BLOCK_N] from the token's scales at scale_base (fp32,
    [N]; block j's in row j; zero at and past n and in rows j >= BLOCKS): one load before the loop (a scale
    load per block would be a synchronous load: only the dot's operands are copied ahead asynchronously)."""
    j = tl.arange(0, BLOCKS_P2)[:, None]
    s = start + j * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return tl.load(scale_base + s, mask=(s < n) & (j < BLOCKS), other=0.0)


@jit
def _block_row(x, j):
    """Row j of x [R, C] -> [C] (exact: the other rows add zeros)."""
    return tl.sum(tl.where(tl.arange(0, x.shape[0])[:, None] == j, x, 0.0), axis=0)


class TopkConfig(NamedTuple):
    """Launch configuration of the kernels (fixed per shape; see `topk_config`)."""

    block_n: int  # keys a block of the score kernel
    blocks: int  # blocks a score program loops over (its q and w loaded once)
    num_warps: int  # of the score kernel
    chunk: int  # split: scores a run (a program); regs: the smallest register size; else scores a pass's step
    select_warps: int  # of the separate select kernel ("split", "regs", "radix")
    select: str = "fused"  # one of SELECTS (the module docstring)
    hi_bits: int = 12  # fused, split: width of the first digit (bins counted by the score programs)
    lo_bits: int = 8  # width of each later digit (regs: of every digit)
    stages: int = 2  # of the score kernel's loop over its run (Triton's num_stages: stages - 1 blocks in flight)
    sort_sizes: int = 3  # split: threshold-bin keys sorted in the smallest of RANK_N >> (sort_sizes - 1) .. RANK_N
    select_regs: int = 0  # split: registers a thread at most (ptxas's maxnreg; 0: the compiler's choice)
    score_kernel: str = "triton"  # the score kernel: "triton" (`_score_kernel`), "wgmma" (ops/indexer_scores_wgmma.py)
    score_regs: int = 0  # wgmma: registers a thread at most (ptxas's maxnreg; 0: the compiler's choice)
    regs_upto: int = 2048  # split: tokens of at most this many keys (a power of two) in registers, beyond in runs


SELECTS = ("fused", "radix", "regs", "split")  # ops/topk_select.py


def topk_config(n_tokens: int, n_keys: int, n_sm: int, fp8: bool = False, wgmma: bool = False) -> TopkConfig:
    """Programs of the score kernel: T x ceil(n_keys / (64 * blocks)); a program reads its token's q
    (Ih x Id, as many bytes as 64 bf16 keys) once for `blocks` blocks, so blocks grow with the batch while
    at least ~8 programs per SM remain (up to 8 blocks).

    The select: "split", 8 warps, at every batch (a token of at most 2048 keys in registers), in runs of 512
    scores where their programs are resident at once, else 2048 (`_select_runs`). Measured on the H200 at Flash
    dims, score + select per layer, 9236 keys a token, 8192 live, bf16 / FP8 keys, us, the runs kept before
    (2048, no register bound of their own: the baseline) against runs of 512 / 1024 / 2048 with the register
    bound and each run's scores loaded beside the bins (results/h200-2026-12-04-indexer-select-runs):
    | batch, 32K | baseline    | 512         | 1024        | 2048          |
    | 1          | 24.0 / 25.2 | 20.5 / 22.7 | 26.6 / 29.8 | 28.7 / 29.0   |
    | 2          | 29.7 / 34.7 | 23.3 / 26.1 | 32.1 / 31.6 | 29.2 / 34.4   |
    | 8          | 47.1 / 39.3 | 43.7 / 33.2 | 45.5 / 36.9 | 46.2 / 40.3   |
    | 16         | 37.8 / 40.1 | 38.7 / 37.9 | 41.5 / 40.8 | 41.4 / 41.1   |
    | 32         | 58.4 / 52.2 | 59.0 / 51.9 | 60.5 / 53.7 | 58.7 / 53.1   |
    | 128        | 114.8 / 91.7 | 133.8 / 111.6 | 124.2 / 101.1 | 114.0 / 92.4 |
    A first digit of 11 or 10 bits (more keys in the threshold bin to sort) and 4-warp programs lost at batch
    1-16 (batch 1, bf16 keys: 24.2 / 38.5 / 42.3 against 21.1 us).
    Earlier measurements of the selects (results/h200-2026-12-03-indexer-select), bf16 keys, us:
    | batch, live context | fused | radix | regs (8 warps) | split, runs of 2048 | split, runs of 1024 |
    | 1, 32K              | 38.3  | 47.9  | 71.7           | 23.3                | 24.0                |
    | 8, 32K              | 50.5  | 55.5  | 78.8           | 30.6                | 31.1                |
    | 32, 32K             | 74.9  | 73.5  | 89.8           | 49.1                | 52.9                |
    | 128, 32K            | 139.3 | 135.4 | 160.2          | 122.6               | 129.4               |
    | 1 / 8 / 32 / 128, 4K | 20.9 / 24.8 / 30.7 / 46.0 | 20.0 / 21.1 / 26.3 / 38.7 | 13.0 / 15.7 / 20.6 / 33.9 | | |
    The split select at 4K runs as regs does (one run: its keys in registers, no bins).
    Remeasured (results/h200-2026-12-03-indexer-fp16-codes), the split select at batch 1 / 32K took 37.4 us,
    and the file of the run above (d17e574) 37.1 in the same run: its 23.3 is not reproduced. Half of its
    select was one sort of 512 slots; sorted in 128-512 slots as the candidates need, and its kernel held to
    72 registers (select_regs), score + select per layer (results/h200-2026-12-04-indexer-select-sorts), us:
    | keys | 1, 32K      | 128, 32K      | 256, 32K      |
    | bf16 | 37.0 / 22.4 | 119.2 / 114.2 | 202.6 / 200.1 |
    | FP8  | 38.7 / 25.4 | 109.7 / 104.2 | 178.6 / 176.7 |
    One program a token with its scores in registers (a "bins" select, not kept) lost everywhere (46.1 us at
    batch 1 / 32K).
    In the decode step (43 Flash layers, results/h200-2026-12-03-select-runs) runs of 1024 took the indexer
    group at batch 1 / 32K from 0.729 to 0.606 ms but at 4K from 0.360 to 0.573 (batch 128 / 4K: 0.674 ->
    0.862), and n_keys is the cache's capacity, not the live context, so no rule on n_keys takes both.
    FP8 keys (fp8): the score kernel keeps two blocks of keys in flight (3 stages), bf16 keys one. H200, score +
    select per layer, us, 2 stages against 3 (results/h200-2026-12-03-indexer-fp16-codes):
    | keys | 128, 4K     | 128, 32K      | 256, 4K     | 256, 32K      |
    | FP8  | 34.4 / 31.3 | 117.7 / 107.8 | 40.2 / 37.8 | 201.1 / 182.0 |
    | bf16 | 32.9 / 29.9 | 116.2 / 116.7 | 42.3 / 45.1 | 203.9 / 201.3 |
    (bf16 keys, batch 32 / 32K: 52.4 / 58.2.) A token's run of one block (batch 1) does not pipeline.
    wgmma (FP8 keys, a 16-bit q, the layer fits ops/indexer_scores_wgmma.py's kernel on a Hopper GPU): that score
    kernel, a ring of 2 blocks (stages: one in flight). H200, score + select per layer, FP8 keys, us, the Triton
    kernel (3 stages) against rings of 2 / 3 / 4 (results/h200-2026-12-04-indexer-wgmma-scores):
    | batch, ctx | Triton | wgmma, 2 / 3 / 4      |
    | 1, 4K      | 14.9   | 14.1 / 14.4 / 14.4    |
    | 1, 32K     | 25.4   | 24.9 / 25.8 / 25.7    |
    | 128, 4K    | 31.0   | 27.4 / 28.1 / 28.6    |
    | 128, 32K   | 103.6  | 91.7 / 92.3 / 95.4    |
    | 256, 4K    | 39.8   | 36.4 / 37.0 / 38.1    |
    | 256, 32K   | 176.4  | 154.0 / 156.3 / 158.4 |"""
    per_token = triton.cdiv(n_keys, 64)
    blocks = max(1, min(8, (n_tokens * per_token) // (8 * n_sm)))
    runs = _select_runs(n_tokens, n_keys, n_sm)
    if fp8 and wgmma:
        return TopkConfig(64, blocks, 4, runs, 8, "split", stages=2, select_regs=72, score_kernel="wgmma")
    return TopkConfig(64, blocks, 4, runs, 8, "split", stages=3 if fp8 else 2, select_regs=72)


def _select_runs(n_tokens: int, n_keys: int, n_sm: int) -> int:
    """The split select's run length: 512 scores where its T x ceil(n_keys / 512) programs are resident at once
    (three an SM: 8 warps at 72 registers), else 2048. Tokens of up to 2048 keys (`regs_upto`) are selected in
    registers whatever the run length."""
    return 512 if n_tokens * triton.cdiv(n_keys, 512) <= 3 * n_sm else 2048


def indexer_topk(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                 n_keys: int, k: int, config: TopkConfig | None = None, pdl: bool = False,
                 q_fp8: bool = False, key_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k compressed entries per token by the indexer score; -1 marks an empty pick.

    q [T, Ih, Id] (roped), w [T, Ih], keys [slots, N, Id] (or uint8 e4m3 codes [slots, N, Id]: FP8 keys, whose
    scales key_scales fp32 [slots, N] are then required), slot [T], n_valid [T]: token t may pick
    s < min(n_valid[t], n_keys). Returns [T, min(k, n_keys)] long, valid picks first.
    pdl: every launch with programmatic dependent launch (resolve_pdl; bitwise the same picks).
    q_fp8: each head's q rounded to e4m3 first (runtime.indexer_q=e4m3; with FP8 keys the FP8 dot).
    The signature and meaning of `torch_path.indexer_topk` (and config, pdl).
    """
    T = q.shape[0]
    k = min(k, n_keys)
    out = torch.empty(T, k, dtype=torch.long, device=q.device)
    if k == 0 or T == 0:
        return out.fill_(-1)
    cfg = config or _default_config(q, keys, n_keys, q_fp8)
    assert cfg.select in SELECTS, cfg.select
    scores = torch.empty(T, n_keys, dtype=torch.float32, device=q.device)
    if cfg.select in ("fused", "split"):  # the first digit's bins and the arrival count (split: tickets and the
        # runs' published counts too): zeroed first, in stream
        width = (1 << cfg.hi_bits) + 1 if cfg.select == "fused" else split_hist_width(cfg.hi_bits, n_keys, cfg.chunk)
        hist = torch.zeros(T, width, dtype=torch.int32, device=q.device)
        if cfg.select == "fused":
            cand = torch.empty(T, n_keys, dtype=torch.int32, device=q.device)
            _launch_scores(q, w, keys, key_scales, slot, n_valid, k, cfg, pdl, q_fp8, scores, hist, (cand, out))
        else:
            _launch_scores(q, w, keys, key_scales, slot, n_valid, k, cfg, pdl, q_fp8, scores, hist,
                           bins_from=cfg.regs_upto)
            _launch_split(scores, hist, n_valid, out, cfg, pdl)
        return out
    _launch_scores(q, w, keys, key_scales, slot, n_valid, k, cfg, pdl, q_fp8, scores)
    args = (scores, scores.stride(0), n_valid, out, out.stride(0), n_keys, k)
    if cfg.select == "regs":
        np2 = triton.next_power_of_2(n_keys)
        min_n = min(cfg.chunk, np2)
        regs_select_kernel[(T,)](*args, MIN_N=min_n, LEVELS=(np2 // min_n).bit_length(), BITS=cfg.lo_bits, PDL=pdl,
                                 num_warps=cfg.select_warps, launch_pdl=pdl)
    else:
        radix_select_kernel[(T,)](*args, CHUNK=cfg.chunk, PDL=pdl, num_warps=cfg.select_warps, launch_pdl=pdl)
    return out


def wgmma_scores(device: torch.device, n_heads: int, head_dim: int, q_dtype: torch.dtype, fp8: bool,
                 q_fp8: bool) -> bool:
    """The Gluon score kernel (ops/indexer_scores_wgmma.py) covers this indexer: FP8 keys (fp8) scored with a
    16-bit q, not q_fp8's FP8 dot, at its dims on a Hopper `device`."""
    return fp8 and not q_fp8 and codes_wgmma_fits(device, n_heads, head_dim, q_dtype)


def _default_config(q: torch.Tensor, keys: torch.Tensor, n_keys: int, q_fp8: bool) -> TopkConfig:
    """topk_config for q [T, Ih, Id] over keys (uint8: FP8 codes), the wgmma score kernel where it covers them."""
    fp8 = keys.dtype == torch.uint8
    wgmma = wgmma_scores(q.device, q.shape[1], q.shape[2], q.dtype, fp8, q_fp8)
    return topk_config(q.shape[0], n_keys, sm_count(q.device), fp8, wgmma)


def _launch_split(scores: torch.Tensor, hist: torch.Tensor, n_valid: torch.Tensor, out: torch.Tensor,
                  cfg: TopkConfig, pdl: bool) -> None:
    """The split select into out [T, k] from scores [T, n_keys] and the bins the score kernel counted: runs of
    cfg.chunk scores, one program each (a token of at most cfg.regs_upto keys in registers)."""
    T, n_keys = scores.shape
    k = out.shape[1]
    runs = triton.cdiv(n_keys, cfg.chunk)
    cand = torch.empty(T, n_keys, dtype=torch.int32, device=scores.device)  # the threshold bin's keys
    reg_n = cfg.regs_upto
    assert reg_n & (reg_n - 1) == 0, f"regs_upto {reg_n}: a power of two"
    assert hist.shape[1] >= split_hist_width(cfg.hi_bits, n_keys, cfg.chunk), hist.shape
    min_n = min(1024, reg_n)
    split_select_kernel[(T, runs)](
        scores, scores.stride(0), hist, hist.stride(0), cand, cand.stride(0), n_valid, out,
        out.stride(0), n_keys, k, SLICE=cfg.chunk, R_P2=triton.next_power_of_2(runs),
        RANK_N=RANK_N, MIN_N=min_n, LEVELS=(reg_n // min_n).bit_length(),
        HI_BITS=cfg.hi_bits, LO_BITS=cfg.lo_bits, LO_PASSES=-(-(32 - cfg.hi_bits) // cfg.lo_bits), CHUNK=cfg.chunk,
        SORT_SIZES=cfg.sort_sizes, PDL=pdl, num_warps=cfg.select_warps, launch_pdl=pdl,
        **({"maxnreg": cfg.select_regs} if cfg.select_regs else {}))


def indexer_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                   n_keys: int, q_fp8: bool = False, config: TopkConfig | None = None,
                   key_scales: torch.Tensor | None = None) -> torch.Tensor:
    """The score kernel alone (indexer_topk's arguments): I[t, s] [T, n_keys] fp32, written for
    s < min(n_valid[t], n_keys) only (the rest is left as allocated). For tests and benchmarks."""
    T = q.shape[0]
    scores = torch.empty(T, n_keys, dtype=torch.float32, device=q.device)
    if T and n_keys:
        cfg = config or _default_config(q, keys, n_keys, q_fp8)
        _launch_scores(q, w, keys, key_scales, slot, n_valid, 0, cfg, False, q_fp8, scores)  # k: selects only
    return scores


def _launch_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, key_scales: torch.Tensor | None,
                   slot: torch.Tensor, n_valid: torch.Tensor, k: int, cfg: TopkConfig, pdl: bool, q_fp8: bool,
                   scores: torch.Tensor, hist: torch.Tensor | None = None,
                   fused: tuple[torch.Tensor, torch.Tensor] | None = None, bins_from: int = 0) -> None:
    """The score kernel into scores [T, n_keys] over keys [slots, N, Id] (FP8: uint8 codes, with key_scales
    fp32 [slots, N]); with hist (zeroed [T, 2^hi_bits + 1] int32) its programs count the first digit's bins
    (of tokens with more than bins_from keys); with fused = (list, picks [T, k]) too, the token's last program
    selects."""
    T, ih, idim = q.shape
    n_keys = scores.shape[1]
    assert q.stride(2) == 1 and keys.stride(2) == 1
    fp8 = keys.dtype == torch.uint8
    if fp8:
        assert key_scales is not None and key_scales.dtype == torch.float32, "FP8 keys need their fp32 key_scales"
        assert key_scales.shape == keys.shape[:2] and key_scales.stride(1) == 1, (key_scales.shape, keys.shape)
    else:
        key_scales = scores  # not read without FP8 keys
    if cfg.score_kernel == "wgmma":
        assert fused is None and wgmma_scores(q.device, ih, idim, q.dtype, fp8, q_fp8), \
            "the wgmma score kernel takes FP8 keys, a 16-bit q at its dims on Hopper, and no fused select"
        codes_scores(q, w, keys, key_scales, slot, n_valid, scores, idim ** -0.5 * ih ** -0.5, cfg.blocks,
                     cfg.stages, pdl, hist, bins_from, cfg.hi_bits, cfg.score_regs)
        return
    cand, out = fused if fused is not None else (scores, scores)  # not read unless fused
    bins = hist is not None
    hist = hist if bins else scores  # not read without bins
    block_h = max(16, triton.next_power_of_2(ih))
    # The FP8 dot takes 32 e4m3 values of K an instruction (wgmma): Id below 32 is masked up to it.
    block_d = max(32 if fp8 and q_fp8 else 16, triton.next_power_of_2(idim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _score_kernel[(T, triton.cdiv(n_keys, cfg.block_n * cfg.blocks))](
        q, q.stride(0), q.stride(1), w, w.stride(0), keys, keys.stride(0), keys.stride(1),
        key_scales, key_scales.stride(0), slot, n_valid,
        scores, scores.stride(0), hist, hist.stride(0), cand, cand.stride(0), out, out.stride(0),
        n_keys, k, idim ** -0.5 * ih ** -0.5,
        IH=ih, ID=idim, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=cfg.block_n, BLOCKS=cfg.blocks,
        BLOCKS_P2=triton.next_power_of_2(cfg.blocks),
        PRECISION=precision, FP8=fp8, CODES16=fp8 and not q_fp8 and q.dtype in (torch.bfloat16, torch.float16),
        Q_FP8=q_fp8, ROW_ALIGN=row_align(keys.stride(0), keys.stride(1)),
        BINS=bins, BINS_FROM=bins_from, FUSED=fused is not None, HI_BITS=cfg.hi_bits, LO_BITS=cfg.lo_bits,
        LO_PASSES=-(-(32 - cfg.hi_bits) // cfg.lo_bits), CHUNK=cfg.chunk, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=cfg.stages, launch_pdl=pdl)
