"""Indexer scores and top-K selection over the compressed keys, in the kernel (Triton).

Same function as `torch_path.indexer_topk`: for token t with n[t] = min(n_valid[t], n_keys) keys,

    I[t, s] = Id^-0.5 * Ih^-0.5 * sum_h w[t, h] * relu(q[t, h] . keys[slot[t], s]),   s < n[t]

and the K largest, ties to the lower index, -1 where fewer than K exist. The select is a radix select on
the scores' order-preserving 32-bit keys (`_order_key`): find the K-th largest key digit by digit, then take
every key above it and, of the keys equal to it, the lowest indices. Every form starts with
`_score_kernel`, grid (T, runs of key blocks): a run of blocks of one token's keys per program (its q and w
loaded once for the run), fp32 scores into a scratch row; a block at or past n[t] (read from device memory)
is not read, and a program whose run starts there returns at once. Four selects (config.select;
`topk_config` picks "split"):

"split" (the default): the score programs add their scores, as they store them, into the token's bins of
the first digit (the top HI_BITS = 12 bits: 4096 bins, so that scores of one binade still spread over 8
bins; relaxed atomics into [T, 4096] int32, zeroed by a memset captured with the kernels), for tokens with
more than one run of the select's keys. Then `_split_kernel`, grid (T, runs of SLICE = config.chunk
scores): each program takes the threshold bin b (the bin of the K-th largest key, from the bins alone),
lists its run's keys of higher bins (picks) and of bin b (candidates), each in index order, stores their
counts and counts itself in (an acq_rel atomic after a barrier). The token's last run to count in
(`_split_finish`) gathers every run's picks into place at once (positions by prefix sums: deterministic),
then sorts the candidates, at most RANK_N = 512 of them (~1-2 % of 8192 random scores), by key and then
lower index, and takes the first ones it still needs; more candidates (heavy ties) are listed and resolved
digit by digit as the fused select does. So no program walks a long context alone: at 32K a token's 8192
scores are walked by 4 programs. A token with at most SLICE keys skips the bins and is selected by its one
program in registers, as "regs".

"regs": the score kernel, then `_select_regs_kernel`, one program per token holding all its live scores
in registers (sizes 1024, 2048, ..: each its own code, the smallest that holds n[t]), digit passes of 8 bits
by tl.histogram stopping once the threshold digit's keys are all taken, then one pass that takes.
Fastest where contexts are short; a histogram pass costs about a nanosecond a score, so at 32K it loses.

"fused" (one launch after the bins' memset): the score programs count bins as "split" does, then each
counts itself in, and the token's last program to count in (run 0 always, for n = 0) selects
(`_select_token`), while other tokens' programs still score: the bin b from the bins; one pass over the n
scores (keys of higher bins to the picks, those of bin b to a list, both in index order); the later digits
(LO_BITS = 8 each, the last what remains) by histograms over the listed keys only; the listed keys above
the K-th taken and, of those equal to it, the lowest indices.

"radix": the score kernel without bins, then `_select_kernel`, grid (T,): one program per token walks its
n scores 5 times (4 passes of 8-bit histograms, then a write pass).

Every form writes 0 .. n[t]-1 and -1 after them when n[t] <= K, with no host branch.

With FP8 keys (uint8 [slots, N, Id + 4], ops/cache_fp8.py) the score kernel reads the e4m3 bytes and the
fp32 scale in place (4-byte vector loads: the host promises the key stride's alignment) and dequantizes in
registers (exact in q's dtype).

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

The keys' scales of a program's run load once before its loop ([BLOCKS_P2, BLOCK_N]: only a dot's operands
are copied ahead asynchronously). Products of two e4m3 values are exact in fp32, so this differs from the
decoded fp32 dot only by the accumulation: in order of summation, and on Hopper in precision (the FP8 MMA
adds its Id products into an accumulator narrower than fp32, about 14 bits as DeepSeek-V3's report measured;
tests/test_fp8_cache_gpu.py states the bound it is held to).
Picks may then differ from the torch path's only where two scores lie within that bound of each other.
Triton's interpreter runs the FP8 dot on the decoded values with fp32 sums.

The picks of a token come packed: valid indices first, then -1 (the sparse attention kernel relies on
it). Their order differs from the torch path's (by score there; here index order ("radix", "regs"), or
the keys of higher first-digit bins by index, then those of the threshold bin); the sets are the same.
-0.0 and +0.0 count as equal, as in torch's sort.

PDL (ops/kernel_support.py): every kernel waits before its first load (the token's key count, then q,
w and the keys: the step's metadata, the indexer's projections and the compressor's cache writes). The
score kernel triggers after its run's last block of keys (fused: before counting itself in, as no
later load reads another kernel's output); the select kernels after their last load of the scores, bins
or counts (at once where a token has no more than K keys), so the trigger follows every load of another
kernel's output. A select kernel's wait is what orders it after the score kernel's stores and bins; the
fused and split selects' last programs read their own kernel's stores, ordered by the count's release and
acquire.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.cache_fp8 import exp2_int, load_key_codes, load_keys, quantize_vectors
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, row_align, sm_count, tl, triton


@jit
def _score_kernel(
    q_ptr, sq_t, sq_h,  # q [T, Ih, Id], last dim contiguous
    w_ptr, sw_t,  # w [T, Ih]
    k_ptr, sk_slot, sk_row,  # keys [slots, N, Id], last dim contiguous (FP8: uint8 [slots, N, Id + 4])
    slot_ptr, nv_ptr,  # [T] long each
    score_ptr, s_score,  # scratch [T, n_keys] fp32
    hist_ptr, s_hist,  # BINS: zeroed scratch [T, 2^HI_BITS + 1] int32 (the first digit's bins, then arrivals)
    cand_ptr, s_cand,  # FUSED: scratch [T, n_keys] int32 (indices of the first digit's threshold bin)
    out_ptr, s_out,  # FUSED: [T, K] long
    n_keys, K, scale,
    IH: tl.constexpr, ID: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr,
    Q_FP8: tl.constexpr, ROW_ALIGN: tl.constexpr, BINS: tl.constexpr, BINS_FROM: tl.constexpr, FUSED: tl.constexpr,
    HI_BITS: tl.constexpr, LO_BITS: tl.constexpr,
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
        base = k_ptr + tl.load(slot_ptr + t) * sk_slot
        if FP8 and Q_FP8:  # the run's key scales, loaded once: the loop's only loads are the key codes
            run_scales = _run_key_scales(base, start, n, sk_row, ID, BLOCKS, BLOCKS_P2, BLOCK_N, ROW_ALIGN)
        for b0 in range(start, tl.minimum(start + BLOCK_N * BLOCKS, n), BLOCK_N):
            s = b0 + tl.arange(0, BLOCK_N)
            km = s < n
            row = base + tl.multiple_of(s.to(tl.int64) * sk_row, ROW_ALIGN)  # [BLOCK_N] row pointers
            if FP8 and Q_FP8:
                k_scale = _block_row(run_scales, (b0 - start) // BLOCK_N)  # [BLOCK_N]
                score = _fp8_dot_scores(q, w, row, d, km, ID) * k_scale * scale  # [BLOCK_N]
            else:
                score = _dot_scores(q, w, row, d, km, ID, FP8, PRECISION) * scale  # [BLOCK_N]
            tl.store(score_ptr + t * s_score + s, score, mask=km)
            if BINS:  # the first digit's histogram, as the scores come (integer adds: any order, same counts)
                digit = (_order_key(score) >> (32 - HI_BITS)).to(tl.int32)
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
                _select_token(score_ptr + t * s_score, hist_ptr + t * s_hist, cand_ptr + t * s_cand,
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
def _dot_scores(q, w, row, d, km, ID: tl.constexpr, FP8: tl.constexpr, PRECISION: tl.constexpr):
    """sum_h w[h] * relu(q[h] . key[n]) [BLOCK_N] for the keys at row pointers row [BLOCK_N] (km: valid), in
    q's dtype on the tensor cores; FP8 keys decoded in registers (e4m3 times the key's scale: exact)."""
    if FP8:
        k = load_keys(row, d, km, ID).to(q.dtype)
    else:
        k = tl.load(row[:, None] + d[None, :], mask=km[:, None] & (d < ID)[None, :], other=0.0)
    logits = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PRECISION), 0.0)  # [BLOCK_H, BLOCK_N]
    return tl.sum(logits * w[:, None], axis=0)


@jit
def _fp8_dot_scores(q_codes, w, row, d, km, ID: tl.constexpr):
    """sum_h w[h] * relu(q_codes[h] . codes[n]) [BLOCK_N]: the FP8 dot of the e4m3 q codes [BLOCK_H, BLOCK_D]
    and the keys' e4m3 codes as stored (no decode in registers: the async copies feed the MMA), fp32
    accumulation. Times each key's scale, the score of the rounded q and key."""
    k_codes = load_key_codes(row, d, km, ID)  # [BLOCK_N, BLOCK_D] e4m3 (K-major: the MMA's B as it needs it)
    logits = tl.maximum(tl.dot(q_codes, tl.trans(k_codes), out_dtype=tl.float32), 0.0)  # [BLOCK_H, BLOCK_N]
    return tl.sum(logits * w[:, None], axis=0)


@jit
def _run_key_scales(base, start, n, sk_row, ID: tl.constexpr, BLOCKS: tl.constexpr, BLOCKS_P2: tl.constexpr,
                    BLOCK_N: tl.constexpr, ROW_ALIGN: tl.constexpr):
    """The fp32 scales of a run's FP8 keys [BLOCKS_P2, BLOCK_N] (block j's in row j; zero at and past n and
    in rows j >= BLOCKS): one load before the loop (a scale load per block would be a synchronous load: only
    the dot's operands are copied ahead asynchronously)."""
    j = tl.arange(0, BLOCKS_P2)[:, None]
    s = start + j * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ptr = base + tl.multiple_of(s.to(tl.int64) * sk_row, [ROW_ALIGN, ROW_ALIGN]) + ID
    return tl.load(ptr.to(tl.pointer_type(tl.float32)), mask=(s < n) & (j < BLOCKS), other=0.0)


@jit
def _block_row(x, j):
    """Row j of x [R, C] -> [C] (exact: the other rows add zeros)."""
    return tl.sum(tl.where(tl.arange(0, x.shape[0])[:, None] == j, x, 0.0), axis=0)


@jit
def _order_key(score):
    """fp32 -> int64 in [0, 2^32) with the order of the floats (-0.0 and +0.0 equal)."""
    score = tl.where(score == 0.0, 0.0, score)
    b = score.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # signed order of the floats
    return b.to(tl.int64) + 2147483647 + 1


@jit
def _digit_pass(row, cand_row, n_cand, prefix, want, HI: tl.constexpr, LO_BITS: tl.constexpr, CHUNK: tl.constexpr):
    """The digit below bit HI (LO_BITS wide, or what remains) of the want-th largest listed key matching
    prefix above HI: (prefix with it, keys still to take from those matching the longer prefix)."""
    SHIFT: tl.constexpr = HI - LO_BITS if HI > LO_BITS else 0
    bins = tl.arange(0, 1 << LO_BITS)
    hist = tl.zeros([1 << LO_BITS], tl.int32)
    for c0 in range(0, n_cand, CHUNK):
        j = c0 + tl.arange(0, CHUNK)
        m = j < n_cand
        idx = tl.load(cand_row + j, mask=m, other=0)  # [CHUNK] listed indices
        key = _order_key(tl.load(row + idx, mask=m, other=0.0, cache_modifier=".cg"))
        m = m & ((key >> HI) == (prefix >> HI))
        hist += tl.histogram(((key >> SHIFT) & ((1 << (HI - SHIFT)) - 1)).to(tl.int32), 1 << LO_BITS, mask=m)
    above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # matching keys in higher bins
    d = tl.max(tl.where((above < want) & (above + hist >= want), bins, -1), axis=0)
    return prefix | (d.to(tl.int64) << SHIFT), want - tl.sum(tl.where(bins == d, above, 0), axis=0)


@jit
def _take_all(o_row, n, K, CHUNK: tl.constexpr):
    """A token with n <= K keys: every key's index in order, then -1 up to K."""
    for i0 in range(0, K, CHUNK):
        i = i0 + tl.arange(0, CHUNK)
        tl.store(o_row + i, tl.where(i < n, i, -1).to(tl.int64), mask=i < K)


@jit
def _take(row, cand_row, o_row, n, prefix, want, LISTED: tl.constexpr, CACHE: tl.constexpr, CHUNK: tl.constexpr):
    """The last pass of a select: keys above prefix are all taken; of those equal to it, the `want` of lowest
    index. Their indices are stored from o_row on, in index order. The keys: row[cand_row[:n]] (LISTED: a list
    in index order), else row[:n]; loaded with cache modifier CACHE."""
    taken = 0
    eq_seen = 0
    for c0 in range(0, n, CHUNK):
        j = c0 + tl.arange(0, CHUNK)
        m = j < n
        if LISTED:
            idx = tl.load(cand_row + j, mask=m, other=0)
        else:
            idx = j
        key = _order_key(tl.load(row + idx, mask=m, other=0.0, cache_modifier=CACHE))
        eq = (m & (key == prefix)).to(tl.int32)
        eq_rank = eq_seen + tl.cumsum(eq, axis=0) - eq
        sel = (m & (key > prefix)) | ((eq != 0) & (eq_rank < want))
        si = sel.to(tl.int32)
        tl.store(o_row + taken + tl.cumsum(si, axis=0) - si, idx.to(tl.int64), mask=sel)
        taken += tl.sum(si, axis=0)
        eq_seen += tl.sum(eq, axis=0)


@jit
def _select_token(
    row, hist_row, cand_row, o_row,  # one token's scores [n], first-digit bins [2^HI_BITS], list [n], picks [K]
    n, K,
    HI_BITS: tl.constexpr, LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr,
):
    """The K picks of a token whose n scores and first-digit bins are in memory (the fused select)."""
    if n <= K:
        _take_all(o_row, n, K, CHUNK)
    else:
        # The first digit's bin b that holds the K-th largest key, from the bins alone.
        bins = tl.arange(0, 1 << HI_BITS)
        hist = tl.load(hist_row + bins, cache_modifier=".cg")  # [2^HI_BITS] (other programs' atomics: L2)
        above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # keys in higher bins
        b = tl.max(tl.where((above < K) & (above + hist >= K), bins, -1), axis=0)
        want = K - tl.sum(tl.where(bins == b, above, 0), axis=0)  # keys still to take from bin b
        # One pass over the scores: keys in higher bins are taken, those in bin b listed (both in index order).
        taken = 0
        n_cand = 0
        for c0 in range(0, n, CHUNK):
            j = c0 + tl.arange(0, CHUNK)
            m = j < n
            key = _order_key(tl.load(row + j, mask=m, other=0.0, cache_modifier=".cg"))
            digit = (key >> (32 - HI_BITS)).to(tl.int32)
            gt = (m & (digit > b)).to(tl.int32)
            eq = (m & (digit == b)).to(tl.int32)
            tl.store(o_row + taken + tl.cumsum(gt, axis=0) - gt, j.to(tl.int64), mask=gt != 0)
            tl.store(cand_row + n_cand + tl.cumsum(eq, axis=0) - eq, j, mask=eq != 0)
            taken += tl.sum(gt, axis=0)
            n_cand += tl.sum(eq, axis=0)
        tl.debug_barrier()  # the list, stored by every thread, before any thread reads it back
        # The lower digits (LO_BITS each, the last one what remains) over the listed keys only.
        prefix = b.to(tl.int64) << (32 - HI_BITS)  # the K-th largest key's bits found so far
        for p in tl.static_range(LO_PASSES):
            prefix, want = _digit_pass(row, cand_row, n_cand, prefix, want, 32 - HI_BITS - LO_BITS * p, LO_BITS,
                                       CHUNK)
        _take(row, cand_row, o_row + taken, n_cand, prefix, want, True, ".cg", CHUNK)  # over the listed keys


@jit
def _select_kernel(
    score_ptr, s_score,  # [T, n_keys] fp32 (the first n[t] of each row written)
    nv_ptr,  # [T] long
    out_ptr, s_out,  # [T, K] long
    n_keys, K,
    CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    t = tl.program_id(0)
    pdl_wait(PDL)
    n = tl.minimum(tl.load(nv_ptr + t), n_keys).to(tl.int32)
    row = score_ptr + t * s_score
    o_row = out_ptr + t * s_out
    if n <= K:
        pdl_trigger(PDL)
        _take_all(o_row, n, K, CHUNK)
    else:
        bins = tl.arange(0, 256)
        prefix = t.to(tl.int64) * 0  # the K-th largest key's bits found so far
        want = K  # keys still to take from the keys matching prefix
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([256], tl.int32)
            for c0 in range(0, n, CHUNK):
                j = c0 + tl.arange(0, CHUNK)
                m = j < n
                key = _order_key(tl.load(row + j, mask=m, other=0.0))
                if p > 0:
                    m = m & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=m)
            above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # matching keys in higher bins
            b = tl.max(tl.where((above < want) & (above + hist >= want), bins, -1), axis=0)
            want -= tl.sum(tl.where(bins == b, above, 0), axis=0)
            prefix = prefix | (b.to(tl.int64) << shift)
        _take(row, row, o_row, n, prefix, want, False, "", CHUNK)  # over every key (row: no list)
        pdl_trigger(PDL)


@jit
def _order_key32(score):
    """fp32 -> uint32 with the order of the floats (-0.0 and +0.0 equal): `_order_key` in 32 bits."""
    b = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # signed order of the floats
    return (b ^ -2147483648).to(tl.uint32, bitcast=True)  # the sign bit flipped: unsigned order


@jit
def _select_in_registers(row, o_row, n, K, N: tl.constexpr, BITS: tl.constexpr):
    """The K picks of a token with K < n <= N scores at row, every key held in registers ([N], one load):
    digit passes of BITS bits from the top (tl.histogram over the keys matching the bits found so far),
    stopping early once the threshold digit's keys are all taken; then one pass takes the keys above the
    threshold's known bits and, of those equal to them, the lowest indices (positions by prefix sums:
    index order, as `_take` over every key)."""
    PASSES: tl.constexpr = (32 + BITS - 1) // BITS
    j = tl.arange(0, N)
    live = j < n
    key = _order_key32(tl.load(row + j, mask=live, other=0.0))  # [N] uint32
    bins = tl.arange(0, 1 << BITS)
    prefix = tl.zeros([], tl.uint32)  # the K-th largest key's bits found so far (above `low`)
    low = tl.full([], 32, tl.int32)  # bits of the K-th largest key not yet known (-1 - low: stopped early)
    want = K + tl.zeros([], tl.int32)  # keys still to take from those matching prefix's bits
    for p in tl.static_range(PASSES):
        HI = 32 - BITS * p  # this pass's digit: bits SHIFT .. HI - 1 (constexpr: p is)
        SHIFT = HI - BITS if HI > BITS else 0
        if low == HI:  # not stopped early
            if p == 0:
                match = live
            else:
                match = live & ((key >> HI) == (prefix >> HI))
            digit = ((key >> SHIFT) & ((1 << (HI - SHIFT)) - 1)).to(tl.int32)
            hist = tl.histogram(digit, 1 << BITS, mask=match)
            above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # matching keys in higher bins
            d = tl.max(tl.where((above < want) & (above + hist >= want), bins, -1), axis=0)
            want -= tl.sum(tl.where(bins == d, above, 0), axis=0)
            prefix = prefix | (d.to(tl.uint32) << SHIFT)
            low = tl.full([], SHIFT, tl.int32)
            if tl.sum(tl.where(bins == d, hist, 0), axis=0) == want:  # every key of the digit is taken
                low = tl.full([], -1 - SHIFT, tl.int32)  # stop
    low = tl.where(low < 0, -1 - low, low).to(tl.uint32)
    hi_key = key >> low
    hi_pre = prefix >> low
    eq = (live & (hi_key == hi_pre)).to(tl.int32)
    sel = (live & (hi_key > hi_pre)) | ((eq != 0) & (tl.cumsum(eq, axis=0) - eq < want))
    si = sel.to(tl.int32)
    tl.store(o_row + tl.cumsum(si, axis=0) - si, j.to(tl.int64), mask=sel)


@jit
def _select_in_register_sizes(row, o_row, n, K, MIN_N: tl.constexpr, LEVELS: tl.constexpr, BITS: tl.constexpr):
    """`_select_in_registers` (K < n <= MIN_N 2^(LEVELS - 1)) in the smallest of the sizes MIN_N, 2 MIN_N, ..
    that holds n (each size its own code: a pass costs the registers' size, not the largest n)."""
    for e in tl.static_range(LEVELS):
        if e == 0:
            fits = n <= MIN_N
        else:
            fits = (n <= (MIN_N << e)) & (n > (MIN_N << (e - 1)))
        if fits:
            _select_in_registers(row, o_row, n, K, MIN_N << e, BITS)


@jit
def _select_regs_kernel(
    score_ptr, s_score,  # [T, n_keys] fp32 (the first n[t] of each row written)
    nv_ptr,  # [T] long
    out_ptr, s_out,  # [T, K] long
    n_keys, K,
    MIN_N: tl.constexpr, LEVELS: tl.constexpr, BITS: tl.constexpr, PDL: tl.constexpr,
):
    """One program a token; its scores in registers, in the smallest of the sizes MIN_N, 2 MIN_N, ..
    MIN_N 2^(LEVELS - 1) that holds its live count (each size its own code: a pass costs the registers'
    size, not n_keys)."""
    t = tl.program_id(0)
    pdl_wait(PDL)
    n = tl.minimum(tl.load(nv_ptr + t), n_keys).to(tl.int32)
    row = score_ptr + t * s_score
    o_row = out_ptr + t * s_out
    if n <= K:
        pdl_trigger(PDL)
        _take_all(o_row, n, K, MIN_N)
    else:
        _select_in_register_sizes(row, o_row, n, K, MIN_N, LEVELS, BITS)
        pdl_trigger(PDL)


@jit
def _threshold_bin(hist_row, K, HI_BITS: tl.constexpr):
    """From a token's first-digit bins [2^HI_BITS] (other programs' atomics: read from L2): (the bin b that
    holds the K-th largest key, keys still to take from it)."""
    bins = tl.arange(0, 1 << HI_BITS)
    hist = tl.load(hist_row + bins, cache_modifier=".cg")
    above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # keys in higher bins
    b = tl.max(tl.where((above < K) & (above + hist >= K), bins, -1), axis=0)
    return b, K - tl.sum(tl.where(bins == b, above, 0), axis=0)


@jit
def _run_lists(part_row, at, start, count, pos, live):
    """Entries pos [P] of the runs' lists joined in run order (run r's: count[r] entries from part_row + at[r];
    start [R]: count's exclusive prefix sum) -> [P] int32, 0 where not live."""
    end = start + count
    r = tl.sum((end[None, :] <= pos[:, None]).to(tl.int32), axis=1)  # the runs ending at or before pos: its run
    pick = tl.arange(0, start.shape[0])[None, :] == r[:, None]  # [P, R]
    base = tl.sum(tl.where(pick, (at - start)[None, :], 0), axis=1)  # its list's offset less its first entry
    return tl.load(part_row + base + pos, mask=live, other=0, cache_modifier=".cg")


@jit
def _split_kernel(
    score_ptr, s_score,  # [T, n_keys] fp32 (the first n[t] of each row written)
    hist_ptr, s_hist,  # [T, 2^HI_BITS + 1] int32: the first digit's bins (the score kernel's), then arrivals
    part_ptr,  # scratch [T, R, SLICE] int32: run r's picks from its start, its threshold-bin keys at its end
    cnt_ptr,  # scratch [T, R, 2] int32: run r's counts of both
    cand_ptr, s_cand,  # scratch [T, n_keys] int32 (the threshold bin's keys, where more than RANK_N)
    nv_ptr,  # [T] long
    out_ptr, s_out,  # [T, K] long
    n_keys, K, R,
    SLICE: tl.constexpr, R_P2: tl.constexpr, K_P2: tl.constexpr, RANK_N: tl.constexpr, MIN_N: tl.constexpr,
    LEVELS: tl.constexpr, HI_BITS: tl.constexpr, LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (t, r): run r (SLICE scores) of token t, against the threshold bin b of the first digit (its
    bins counted by the score kernel's programs): keys of higher bins listed as picks, those of bin b as
    candidates, both in index order, with their counts. The token's last run to arrive (an acq_rel count)
    finishes (`_split_finish`)."""
    t = tl.program_id(0)
    r = tl.program_id(1)
    start = r * SLICE
    pdl_wait(PDL)
    n = tl.minimum(tl.load(nv_ptr + t), n_keys).to(tl.int32)
    o_row = out_ptr + t * s_out
    if n <= K:
        if r == 0:
            _take_all(o_row, n, K, CHUNK)
        pdl_trigger(PDL)
    elif n <= SLICE:  # one run (no bins were counted): its keys in registers, as the register select
        if r == 0:
            _select_in_register_sizes(score_ptr + t * s_score, o_row, n, K, MIN_N, LEVELS, LO_BITS)
        pdl_trigger(PDL)
    elif start < n:
        row = score_ptr + t * s_score
        b, want = _threshold_bin(hist_ptr + t * s_hist, K, HI_BITS)
        j = start + tl.arange(0, SLICE)
        m = j < n
        digit = (_order_key(tl.load(row + j, mask=m, other=0.0, cache_modifier=".cg")) >> (32 - HI_BITS))
        gt = (m & (digit > b)).to(tl.int32)
        eq = (m & (digit == b)).to(tl.int32)
        n_eq = tl.sum(eq, axis=0)
        part = part_ptr + (t * R + r) * SLICE
        tl.store(part + tl.cumsum(gt, axis=0) - gt, j, mask=gt != 0)
        tl.store(part + SLICE - n_eq + tl.cumsum(eq, axis=0) - eq, j, mask=eq != 0)
        tl.store(cnt_ptr + (t * R + r) * 2, tl.sum(gt, axis=0))
        tl.store(cnt_ptr + (t * R + r) * 2 + 1, n_eq)
        tl.debug_barrier()  # every thread's stores of this program before the release
        if tl.atomic_add(hist_ptr + t * s_hist + (1 << HI_BITS), 1, sem="acq_rel") == tl.cdiv(n, SLICE) - 1:
            _split_finish(row, part_ptr + t * R * SLICE, cnt_ptr + t * R * 2, cand_ptr + t * s_cand, o_row, n,
                          want, b, tl.cdiv(n, SLICE), SLICE, R_P2, K_P2, RANK_N, HI_BITS, LO_BITS, LO_PASSES,
                          CHUNK)
        pdl_trigger(PDL)


@jit
def _split_finish(row, part_row, cnt_row, cand_row, o_row, n, want, b, n_runs, SLICE: tl.constexpr,
                  R_P2: tl.constexpr, K_P2: tl.constexpr, RANK_N: tl.constexpr, HI_BITS: tl.constexpr,
                  LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr):
    """The token's picks from its runs' lists: every run's picks, in run order (one gather: fewer than K), then
    `want` of the threshold bin's keys: sorted at once where at most RANK_N (by key, ties to the lower index),
    else listed and resolved digit by digit as the fused select does."""
    runs = tl.arange(0, R_P2)
    rm = runs < n_runs
    c_gt = tl.load(cnt_row + runs * 2, mask=rm, other=0, cache_modifier=".cg")
    c_eq = tl.load(cnt_row + runs * 2 + 1, mask=rm, other=0, cache_modifier=".cg")
    s_gt = tl.cumsum(c_gt, axis=0) - c_gt
    s_eq = tl.cumsum(c_eq, axis=0) - c_eq
    taken = tl.sum(c_gt, axis=0)
    n_cand = tl.sum(c_eq, axis=0)
    runs_at = runs * SLICE
    p = tl.arange(0, K_P2)
    tl.store(o_row + p, _run_lists(part_row, runs_at, s_gt, c_gt, p, p < taken).to(tl.int64), mask=p < taken)
    if n_cand <= RANK_N:
        c = tl.arange(0, RANK_N)
        cm = c < n_cand
        idx = _run_lists(part_row, runs_at + SLICE - c_eq, s_eq, c_eq, c, cm)  # [RANK_N] in index order
        key = _order_key32(tl.load(row + idx, mask=cm, other=0.0, cache_modifier=".cg"))  # [RANK_N] uint32
        # one sort, largest first, of (key, then the lower index first): its first `want` are the picks
        low = tl.full([RANK_N], 0xFFFFFFFF, tl.uint64) - idx.to(tl.uint64)
        order = tl.sort(tl.where(cm, (key.to(tl.uint64) << 32) | low, 0), descending=True)
        picked = tl.full([RANK_N], 0xFFFFFFFF, tl.uint64) - (order & 0xFFFFFFFF)
        tl.store(o_row + taken + c, picked.to(tl.int64), mask=c < want)
    else:
        for c0 in range(0, n_cand, RANK_N):
            c = c0 + tl.arange(0, RANK_N)
            cm = c < n_cand
            tl.store(cand_row + c, _run_lists(part_row, runs_at + SLICE - c_eq, s_eq, c_eq, c, cm), mask=cm)
        tl.debug_barrier()  # the list, stored by every thread, before any thread reads it back
        prefix = b.to(tl.int64) << (32 - HI_BITS)
        for q in tl.static_range(LO_PASSES):
            prefix, want = _digit_pass(row, cand_row, n_cand, prefix, want, 32 - HI_BITS - LO_BITS * q, LO_BITS,
                                       CHUNK)
        _take(row, cand_row, o_row + taken, n_cand, prefix, want, True, ".cg", CHUNK)


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


SELECTS = ("fused", "radix", "regs", "split")
RANK_N = 512  # split: threshold-bin keys sorted at once up to this many


def topk_config(n_tokens: int, n_keys: int, n_sm: int) -> TopkConfig:
    """Programs of the score kernel: T x ceil(n_keys / (64 * blocks)); a program reads its token's q
    (Ih x Id, as many bytes as 64 bf16 keys) once for `blocks` blocks, so blocks grow with the batch while
    at least ~8 programs per SM remain (up to 8 blocks).

    The select: "split" in runs of 2048 scores, 8 warps, at every batch (a token of at most 2048 keys in
    registers). Measured on the H200 at Flash dims, score + select per layer, bf16 keys, 9236 keys a token
    (benchmarks/indexer_sweep.py; results/h200-2026-12-03-indexer-select), us:
    | batch, live context | fused | radix | regs (8 warps) | split, runs of 2048 | split, runs of 1024 |
    | 1, 32K              | 38.3  | 47.9  | 71.7           | 23.3                | 24.0                |
    | 8, 32K              | 50.5  | 55.5  | 78.8           | 30.6                | 31.1                |
    | 32, 32K             | 74.9  | 73.5  | 89.8           | 49.1                | 52.9                |
    | 128, 32K            | 139.3 | 135.4 | 160.2          | 122.6               | 129.4               |
    | 1 / 8 / 32 / 128, 4K | 20.9 / 24.8 / 30.7 / 46.0 | 20.0 / 21.1 / 26.3 / 38.7 | 13.0 / 15.7 / 20.6 / 33.9 | | |
    The split select at 4K runs as regs does (one run: its keys in registers, no bins)."""
    per_token = triton.cdiv(n_keys, 64)
    blocks = max(1, min(8, (n_tokens * per_token) // (8 * n_sm)))
    return TopkConfig(64, blocks, 4, 2048, 8, "split")


def indexer_topk(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                 n_keys: int, k: int, config: TopkConfig | None = None, pdl: bool = False,
                 q_fp8: bool = False) -> torch.Tensor:
    """Top-k compressed entries per token by the indexer score; -1 marks an empty pick.

    q [T, Ih, Id] (roped), w [T, Ih], keys [slots, N, Id] (or uint8 [slots, N, Id + 4]: FP8 keys), slot [T],
    n_valid [T]: token t may pick
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
    cfg = config or topk_config(T, n_keys, sm_count(q.device))
    assert cfg.select in SELECTS, cfg.select
    scores = torch.empty(T, n_keys, dtype=torch.float32, device=q.device)
    if cfg.select == "fused":  # the first digit's bins and the arrival count: zeroed in the stream, first
        hist = torch.zeros(T, (1 << cfg.hi_bits) + 1, dtype=torch.int32, device=q.device)
        cand = torch.empty(T, n_keys, dtype=torch.int32, device=q.device)
        _launch_scores(q, w, keys, slot, n_valid, k, cfg, pdl, q_fp8, scores, hist, (cand, out))
    elif cfg.select == "split":  # bins zeroed first, as fused; then runs of `chunk` scores, several a token
        hist = torch.zeros(T, (1 << cfg.hi_bits) + 1, dtype=torch.int32, device=q.device)
        runs = triton.cdiv(n_keys, cfg.chunk)
        part = torch.empty(T, runs, cfg.chunk, dtype=torch.int32, device=q.device)
        cnt = torch.empty(T, runs, 2, dtype=torch.int32, device=q.device)
        cand = torch.empty(T, n_keys, dtype=torch.int32, device=q.device)
        _launch_scores(q, w, keys, slot, n_valid, k, cfg, pdl, q_fp8, scores, hist, bins_from=cfg.chunk)
        min_n = min(1024, cfg.chunk)
        _split_kernel[(T, runs)](
            scores, scores.stride(0), hist, hist.stride(0), part, cnt, cand, cand.stride(0), n_valid, out,
            out.stride(0), n_keys, k, runs, SLICE=cfg.chunk, R_P2=triton.next_power_of_2(runs),
            K_P2=triton.next_power_of_2(k), RANK_N=RANK_N, MIN_N=min_n, LEVELS=(cfg.chunk // min_n).bit_length(),
            HI_BITS=cfg.hi_bits, LO_BITS=cfg.lo_bits,
            LO_PASSES=-(-(32 - cfg.hi_bits) // cfg.lo_bits), CHUNK=cfg.chunk, PDL=pdl, num_warps=cfg.select_warps,
            launch_pdl=pdl)
    elif cfg.select == "regs":
        _launch_scores(q, w, keys, slot, n_valid, k, cfg, pdl, q_fp8, scores)
        np2 = triton.next_power_of_2(n_keys)
        min_n = min(cfg.chunk, np2)
        _select_regs_kernel[(T,)](scores, scores.stride(0), n_valid, out, out.stride(0), n_keys, k,
                                  MIN_N=min_n, LEVELS=(np2 // min_n).bit_length(), BITS=cfg.lo_bits, PDL=pdl,
                                  num_warps=cfg.select_warps, launch_pdl=pdl)
    else:
        _launch_scores(q, w, keys, slot, n_valid, k, cfg, pdl, q_fp8, scores)
        _select_kernel[(T,)](scores, scores.stride(0), n_valid, out, out.stride(0), n_keys, k,
                             CHUNK=cfg.chunk, PDL=pdl, num_warps=cfg.select_warps, launch_pdl=pdl)
    return out


def indexer_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                   n_keys: int, q_fp8: bool = False, config: TopkConfig | None = None) -> torch.Tensor:
    """The score kernel alone (indexer_topk's arguments): I[t, s] [T, n_keys] fp32, written for
    s < min(n_valid[t], n_keys) only (the rest is left as allocated). For tests and benchmarks."""
    T = q.shape[0]
    scores = torch.empty(T, n_keys, dtype=torch.float32, device=q.device)
    if T and n_keys:
        cfg = config or topk_config(T, n_keys, sm_count(q.device))
        _launch_scores(q, w, keys, slot, n_valid, 0, cfg, False, q_fp8, scores)  # k: read by selects only
    return scores


def _launch_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                   k: int, cfg: TopkConfig, pdl: bool, q_fp8: bool, scores: torch.Tensor,
                   hist: torch.Tensor | None = None, fused: tuple[torch.Tensor, torch.Tensor] | None = None,
                   bins_from: int = 0) -> None:
    """The score kernel into scores [T, n_keys]; with hist (zeroed [T, 2^hi_bits + 1] int32) its programs count
    the first digit's bins (of tokens with more than bins_from keys); with fused = (list, picks [T, k]) too,
    the token's last program selects."""
    T, ih, idim = q.shape
    n_keys = scores.shape[1]
    assert q.stride(2) == 1 and keys.stride(2) == 1
    fp8 = keys.dtype == torch.uint8
    cand, out = fused if fused is not None else (scores, scores)  # not read unless fused
    bins = hist is not None
    hist = hist if bins else scores  # not read without bins
    block_h = max(16, triton.next_power_of_2(ih))
    # The FP8 dot takes 32 e4m3 values of K an instruction (wgmma): Id below 32 is masked up to it.
    block_d = max(32 if fp8 and q_fp8 else 16, triton.next_power_of_2(idim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _score_kernel[(T, triton.cdiv(n_keys, cfg.block_n * cfg.blocks))](
        q, q.stride(0), q.stride(1), w, w.stride(0), keys, keys.stride(0), keys.stride(1), slot, n_valid,
        scores, scores.stride(0), hist, hist.stride(0), cand, cand.stride(0), out, out.stride(0),
        n_keys, k, idim ** -0.5 * ih ** -0.5,
        IH=ih, ID=idim, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=cfg.block_n, BLOCKS=cfg.blocks,
        BLOCKS_P2=triton.next_power_of_2(cfg.blocks),
        PRECISION=precision, FP8=fp8, Q_FP8=q_fp8, ROW_ALIGN=row_align(keys.stride(0), keys.stride(1)),
        BINS=bins, BINS_FROM=bins_from, FUSED=fused is not None, HI_BITS=cfg.hi_bits, LO_BITS=cfg.lo_bits,
        LO_PASSES=-(-(32 - cfg.hi_bits) // cfg.lo_bits), CHUNK=cfg.chunk, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=2, launch_pdl=pdl)
