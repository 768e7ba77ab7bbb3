"""Top-K selection over each token's indexer scores (Triton): the selects of ops/indexer_topk.py.

The K largest of a token's n scores, ties to the lower index, -1 where fewer than K exist: a radix select on
the scores' order-preserving 32-bit keys (`order_key`): find the K-th largest key digit by digit, then take
every key above it and, of the keys equal to it, the lowest indices. Four selects (TopkConfig.select;
`indexer_topk.topk_config` picks "split"). Each reads the score kernel's scratch rows of scores and, for
"split" and "fused", the bins of the first digit its programs counted (the top HI_BITS bits).

"split" (`split_select_kernel`, grid (T, runs of SLICE scores)): each program takes a ticket, its run (an
atomic count: tickets go in the order programs start), and the threshold bin b (the bin of the K-th largest
key, from the bins alone); it counts its run's keys of higher bins (picks) and of bin b (candidates) and
publishes both counts (one int64 word a run in the token's zeroed scratch row), then sums those of the runs
before it, waiting for any not yet published (each of them started before it and publishes before it waits:
no deadlock). Those sums place its picks straight into the token's row of picks and its candidates into the
token's one list, both in index order (deterministic: positions by the counts, not by timing). It counts
itself in (an acq_rel atomic after a barrier); the token's last run to count in (`_split_finish`) sorts the
candidates, at most RANK_N of them (~1-5 % of 8192 random scores), by key and then lower index, in the
smallest of 128, 256 or 512 slots that holds them (a sort costs its slots: 10 us at 512 on an H200), and
takes the first ones it still needs; more candidates (heavy ties) are resolved digit by digit as the fused
select does (about 30 us). Before, the last run gathered every run's lists into place; that finish was long
straight-line code that each token's last program fetched cold (Nsight Compute: instruction fetch was 58 % of
the select's stalls at batch 1 / 32K). The kernel is held to TopkConfig.select_regs registers a thread (three
programs an SM). So no program walks a long context alone: at 32K a token's 8192 scores are walked by
8192 / SLICE programs. A token with at most REG_N keys (2048 by default; no bins were counted for it) is
selected by its first program in registers, as "regs", whatever SLICE is: a short context never pays the
runs' handoff, while a long one can be cut into short runs where few tokens leave SMs idle. Each run loads its
scores beside the bins (no round trip waits for the other).

"regs" (`regs_select_kernel`, grid (T,)): one program per token holds all its live scores in registers
(sizes 1024, 2048, ..: each its own code, the smallest that holds n), digit passes of BITS bits by
tl.histogram, stopping once the threshold digit's keys are all taken, then one pass that takes. Fastest
where contexts are short; a histogram pass costs about a nanosecond a score on one SM, so at 32K it loses.

"fused" (`select_token`, called by the score kernel's last program of a token): the bin b from the bins;
one pass over the n scores (keys of higher bins to the picks, those of bin b to a list, both in index
order); the later digits (LO_BITS each, the last what remains) by histograms over the listed keys only;
the listed keys above the K-th taken and, of those equal to it, the lowest indices.

"radix" (`radix_select_kernel`, grid (T,)): one program per token walks its n scores 5 times (4 passes of
8-bit histograms, then a write pass).

Every select writes 0 .. n-1 and -1 after them when n <= K, with no host branch. The picks come packed:
valid indices first, then -1, in index order ("radix", "regs") or the keys of higher first-digit bins by
index, then those of the threshold bin ("split", "fused").

PDL (ops/kernel_support.py): each select kernel waits before its first load of the score kernel's data (the
scores, the bins) and triggers after its last load of them (at once where a token has no more than K keys).
The radix and regs selects load the token's count after the wait too; the split select loads it and
takes its ticket before (their round trips overlap the score kernel's tail): kernels before the score
kernel wrote the count and zeroed the tickets, and the select launches only once every score program has
passed its own wait, which returns once those kernels have completed and their writes are visible. The split
select's runs read each other's published counts by acquiring atomics; the split and fused selects' last
programs read their own kernel's stores, ordered by the count's release and acquire.
"""

from __future__ import annotations

from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl

RANK_N = 512  # split: threshold-bin keys sorted at once up to this many


def split_hist_width(hi_bits: int, n_keys: int, slice_: int) -> int:
    """int32 columns a token's row of the split select's zeroed scratch takes: 2^hi_bits bins, the arrival count,
    the ticket count, then an int64 word a run (its published counts; two columns each, 8-byte aligned)."""
    runs = -(-n_keys // slice_)
    return (1 << hi_bits) + 2 + 2 * (1 << (runs - 1).bit_length())


@jit
def order_key(score):
    """fp32 -> int64 in [0, 2^32) with the order of the floats (-0.0 and +0.0 equal)."""
    score = tl.where(score == 0.0, 0.0, score)
    b = score.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # signed order of the floats
    return b.to(tl.int64) + 2147483647 + 1


@jit
def _threshold_digit(hist, want):
    """hist [B]: counts of the candidate keys by digit -> (the digit of the want-th largest candidate, keys
    still to take from that digit once the higher digits' keys are all taken)."""
    bins = tl.arange(0, hist.shape[0])
    above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # keys in higher digits
    d = tl.max(tl.where((above < want) & (above + hist >= want), bins, -1), axis=0)
    return d, want - tl.sum(tl.where(bins == d, above, 0), axis=0)


@jit
def _digit_pass(row, cand_row, n_cand, prefix, want, HI: tl.constexpr, LO_BITS: tl.constexpr, CHUNK: tl.constexpr):
    """The digit below bit HI (LO_BITS wide, or what remains) of the want-th largest listed key matching
    prefix above HI: (prefix with it, keys still to take from those matching the longer prefix)."""
    SHIFT: tl.constexpr = HI - LO_BITS if HI > LO_BITS else 0
    hist = tl.zeros([1 << LO_BITS], tl.int32)
    for c0 in range(0, n_cand, CHUNK):
        j = c0 + tl.arange(0, CHUNK)
        m = j < n_cand
        idx = tl.load(cand_row + j, mask=m, other=0)  # [CHUNK] listed indices
        key = order_key(tl.load(row + idx, mask=m, other=0.0, cache_modifier=".cg"))
        m = m & ((key >> HI) == (prefix >> HI))
        hist += tl.histogram(((key >> SHIFT) & ((1 << (HI - SHIFT)) - 1)).to(tl.int32), 1 << LO_BITS, mask=m)
    d, want = _threshold_digit(hist, want)
    return prefix | (d.to(tl.int64) << SHIFT), want


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
        key = order_key(tl.load(row + idx, mask=m, other=0.0, cache_modifier=CACHE))
        eq = (m & (key == prefix)).to(tl.int32)
        eq_rank = eq_seen + tl.cumsum(eq, axis=0) - eq
        sel = (m & (key > prefix)) | ((eq != 0) & (eq_rank < want))
        si = sel.to(tl.int32)
        tl.store(o_row + taken + tl.cumsum(si, axis=0) - si, idx.to(tl.int64), mask=sel)
        taken += tl.sum(si, axis=0)
        eq_seen += tl.sum(eq, axis=0)


@jit
def select_token(
    row, hist_row, cand_row, o_row,  # one token's scores [n], first-digit bins [2^HI_BITS], list [n], picks [K]
    n, K,
    HI_BITS: tl.constexpr, LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr,
):
    """The K picks of a token whose n scores and first-digit bins are in memory (the fused select)."""
    if n <= K:
        _take_all(o_row, n, K, CHUNK)
    else:
        b, want = _threshold_bin(hist_row, K, HI_BITS)  # the first digit's bin of the K-th largest key
        # One pass over the scores: keys in higher bins are taken, those in bin b listed (both in index order).
        taken = 0
        n_cand = 0
        for c0 in range(0, n, CHUNK):
            j = c0 + tl.arange(0, CHUNK)
            m = j < n
            key = order_key(tl.load(row + j, mask=m, other=0.0, cache_modifier=".cg"))
            digit = (key >> (32 - HI_BITS)).to(tl.int32)
            gt = (m & (digit > b)).to(tl.int32)
            eq = (m & (digit == b)).to(tl.int32)
            tl.store(o_row + taken + tl.cumsum(gt, axis=0) - gt, j.to(tl.int64), mask=gt != 0)
            tl.store(cand_row + n_cand + tl.cumsum(eq, axis=0) - eq, j, mask=eq != 0)
            taken += tl.sum(gt, axis=0)
            n_cand += tl.sum(eq, axis=0)
        tl.debug_barrier()  # the list, stored by every thread, before any thread reads it back
        _take_listed(row, cand_row, o_row + taken, n_cand, b, want, HI_BITS, LO_BITS, LO_PASSES, CHUNK)


@jit
def _take_listed(row, cand_row, o_row, n_cand, b, want, HI_BITS: tl.constexpr, LO_BITS: tl.constexpr,
                 LO_PASSES: tl.constexpr, CHUNK: tl.constexpr):
    """`want` of the n_cand listed keys (row[cand_row[:n_cand]], in index order, all in first-digit bin b)
    into o_row: the lower digits (LO_BITS each, the last one what remains) over the listed keys only, then
    the keys above the K-th and, of those equal to it, the lowest indices."""
    prefix = b.to(tl.int64) << (32 - HI_BITS)  # the K-th largest key's bits found so far
    for p in tl.static_range(LO_PASSES):
        prefix, want = _digit_pass(row, cand_row, n_cand, prefix, want, 32 - HI_BITS - LO_BITS * p, LO_BITS, CHUNK)
    _take(row, cand_row, o_row, n_cand, prefix, want, True, ".cg", CHUNK)


@jit
def radix_select_kernel(
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
        prefix = t.to(tl.int64) * 0  # the K-th largest key's bits found so far
        want = K  # keys still to take from the keys matching prefix
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([256], tl.int32)
            for c0 in range(0, n, CHUNK):
                j = c0 + tl.arange(0, CHUNK)
                m = j < n
                key = order_key(tl.load(row + j, mask=m, other=0.0))
                if p > 0:
                    m = m & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=m)
            b, want = _threshold_digit(hist, want)
            prefix = prefix | (b.to(tl.int64) << shift)
        _take(row, row, o_row, n, prefix, want, False, "", CHUNK)  # over every key (row: no list)
        pdl_trigger(PDL)


@jit
def _order_key32(score):
    """fp32 -> uint32 with the order of the floats (-0.0 and +0.0 equal): `order_key` in 32 bits."""
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
            d, want = _threshold_digit(hist, want)
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
def regs_select_kernel(
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
    return _threshold_digit(tl.load(hist_row + tl.arange(0, 1 << HI_BITS), cache_modifier=".cg"), K)


@jit
def split_select_kernel(
    score_ptr, s_score,  # [T, n_keys] fp32 (the first n[t] of each row written)
    hist_ptr, s_hist,  # [T, HIST_W] int32, zeroed: the first digit's bins (the score kernel's), arrivals, tickets,
    # then the runs' published counts as int64 words (`split_hist_width`)
    cand_ptr, s_cand,  # scratch [T, n_keys] int32: the threshold bin's keys, one list in index order
    nv_ptr,  # [T] long
    out_ptr, s_out,  # [T, K] long
    n_keys, K,
    SLICE: tl.constexpr, R_P2: tl.constexpr, RANK_N: tl.constexpr, MIN_N: tl.constexpr,
    LEVELS: tl.constexpr, HI_BITS: tl.constexpr, LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr,
    SORT_SIZES: tl.constexpr, PDL: tl.constexpr,
):
    """Program (t, .): a token of at most REG_N = MIN_N 2^(LEVELS - 1) keys (no bins were counted for it) is
    selected in registers by its program 0, as the register select. Beyond, the program takes a ticket i (an
    atomic count: tickets go in the order programs start) and walks run i (SLICE scores) against the threshold
    bin b of the first digit: it publishes its counts of keys above bin b (picks) and in it (candidates), sums
    those of runs 0 .. i - 1 (waiting for any not yet published: each of them started before it, and publishes
    before it waits), and stores its picks into place in the token's row of picks and its candidates into the
    token's one list, both in index order. The token's last run to arrive (an acq_rel count) finishes
    (`_split_finish`)."""
    t = tl.program_id(0)
    first = tl.program_id(1) == 0
    o_row = out_ptr + t * s_out
    h_row = hist_ptr + t * s_hist
    # Before the wait (`PDL` in the module docstring): the token's count and, past the register bound, this
    # program's run (a ticket).
    n = tl.minimum(tl.load(nv_ptr + t), n_keys).to(tl.int32)
    runs = n > (MIN_N << (LEVELS - 1))
    r = tl.atomic_add(h_row + (1 << HI_BITS) + 1, 1, mask=runs, sem="relaxed")
    pdl_wait(PDL)
    if n <= K:
        if first:
            _take_all(o_row, n, K, CHUNK)
        pdl_trigger(PDL)
    elif n <= (MIN_N << (LEVELS - 1)):  # no bins were counted: its keys in registers, as the register select
        if first:
            _select_in_register_sizes(score_ptr + t * s_score, o_row, n, K, MIN_N, LEVELS, LO_BITS)
        pdl_trigger(PDL)
    else:
        n_runs = tl.cdiv(n, SLICE)
        if r < n_runs:
            row = score_ptr + t * s_score
            j = r * SLICE + tl.arange(0, SLICE)
            m = j < n
            # the run's scores load beside the bins (neither waits for the other's round trip)
            score = tl.load(row + j, mask=m, other=0.0, cache_modifier=".cg")
            b, want = _threshold_bin(h_row, K, HI_BITS)
            digit = order_key(score) >> (32 - HI_BITS)
            gt = (m & (digit > b)).to(tl.int32)
            eq = (m & (digit == b)).to(tl.int32)
            counts = _look_back(h_row + (1 << HI_BITS) + 2, r, tl.sum(gt, axis=0), tl.sum(eq, axis=0), R_P2)
            tl.store(o_row + counts[0] + tl.cumsum(gt, axis=0) - gt, j.to(tl.int64), mask=gt != 0)
            cand_row = cand_ptr + t * s_cand
            tl.store(cand_row + counts[1] + tl.cumsum(eq, axis=0) - eq, j, mask=eq != 0)
            tl.debug_barrier()  # every thread's stores of this program before the release
            if tl.atomic_add(h_row + (1 << HI_BITS), 1, sem="acq_rel") == n_runs - 1:
                taken, n_cand = _published_totals(h_row + (1 << HI_BITS) + 2, n_runs, R_P2)
                _split_finish(row, cand_row, o_row + taken, n_cand, want, b, RANK_N, HI_BITS, LO_BITS, LO_PASSES,
                              CHUNK, SORT_SIZES)
        pdl_trigger(PDL)


@jit
def _look_back(pub_row, r, c_gt, c_eq, R_P2: tl.constexpr):
    """Publish run r's counts (c_gt, c_eq) at pub_row (int32 pairs read as int64 words, zeroed: 0 = not yet),
    then wait until runs 0 .. r - 1 have published theirs -> (their picks, their candidates): where this run's
    lists start."""
    words = pub_row.to(tl.pointer_type(tl.int64))
    flag = tl.full([], 1 << 62, tl.int64)
    tl.atomic_xchg(words + r, flag | (c_gt.to(tl.int64) << 31) | c_eq.to(tl.int64), sem="release")
    runs = tl.arange(0, R_P2)
    before = runs < r
    w = tl.atomic_add(words + runs, 0, mask=before, sem="acquire")
    while tl.sum((before & (w == 0)).to(tl.int32), axis=0) > 0:
        w = tl.atomic_add(words + runs, 0, mask=before, sem="acquire")
    w = tl.where(before, w, 0)
    return (tl.sum((w >> 31) & 0x7FFFFFFF, axis=0).to(tl.int32), tl.sum(w & 0x7FFFFFFF, axis=0).to(tl.int32))


@jit
def _published_totals(pub_row, n_runs, R_P2: tl.constexpr):
    """The picks and candidates of all n_runs runs (every one published before it counted itself in)."""
    words = pub_row.to(tl.pointer_type(tl.int64))
    runs = tl.arange(0, R_P2)
    w = tl.load(words + runs, mask=runs < n_runs, other=0, cache_modifier=".cg")
    return tl.sum((w >> 31) & 0x7FFFFFFF, axis=0).to(tl.int32), tl.sum(w & 0x7FFFFFFF, axis=0).to(tl.int32)


@jit
def _split_finish(row, cand_row, o_row, n_cand, want, b, RANK_N: tl.constexpr, HI_BITS: tl.constexpr,
                  LO_BITS: tl.constexpr, LO_PASSES: tl.constexpr, CHUNK: tl.constexpr, SORT_SIZES: tl.constexpr):
    """`want` of the threshold bin's n_cand keys (listed at cand_row in index order) into o_row: sorted at once
    where at most RANK_N (by key, ties to the lower index; in the smallest of SORT_SIZES sizes that holds them,
    each its own code: a sort costs its size, 10 us at 512 on an H200, 4 at 256), else resolved digit by digit
    as the fused select does."""
    if n_cand <= RANK_N:  # sorted in the smallest of RANK_N >> (SORT_SIZES - 1), .., RANK_N that holds them
        for e in tl.static_range(SORT_SIZES):
            if e == 0:
                fits = n_cand <= (RANK_N >> (SORT_SIZES - 1))
            else:
                fits = (n_cand <= (RANK_N >> (SORT_SIZES - 1 - e))) & (n_cand > (RANK_N >> (SORT_SIZES - e)))
            if fits:
                _sort_listed(row, cand_row, o_row, n_cand, want, RANK_N >> (SORT_SIZES - 1 - e))
    else:
        _take_listed(row, cand_row, o_row, n_cand, b, want, HI_BITS, LO_BITS, LO_PASSES, CHUNK)


@jit
def _sort_listed(row, cand_row, o_row, n_cand, want, N: tl.constexpr):
    """The `want` largest of the n_cand <= N keys row[i] listed at cand_row (index order), ties to the lower
    index, into o_row: one sort of N slots, largest first, of (key, then the lower index first)."""
    c = tl.arange(0, N)
    cm = c < n_cand
    idx = tl.load(cand_row + c, mask=cm, other=0, cache_modifier=".cg")  # [N] in index order
    key = _order_key32(tl.load(row + idx, mask=cm, other=0.0, cache_modifier=".cg"))  # [N] uint32
    low = tl.full([N], 0xFFFFFFFF, tl.uint64) - idx.to(tl.uint64)
    order = tl.sort(tl.where(cm, (key.to(tl.uint64) << 32) | low, 0), descending=True)
    picked = tl.full([N], 0xFFFFFFFF, tl.uint64) - (order & 0xFFFFFFFF)
    tl.store(o_row + c, picked.to(tl.int64), mask=c < want)
