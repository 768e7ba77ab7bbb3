"""Sparse attention with sink over a token's window rows and compressed rows, read from the caches by index (Triton).

For token t and local head h, with candidates j = the W window positions pos_t - W + 1 .. pos_t (oldest
first) followed by the compressed entries (ratio 4: the indexer's picks; ratio 128: every entry below
the token's count of completed blocks):

    s_j = scale * q[t, h] . row_j,   m = max(max_j s_j, sink_h)
    o[t, h] = sum_j exp(s_j - m) row_j / (sum_j exp(s_j - m) + exp(sink_h - m))

then the inverse rotary of o's last Dr dims at pos_t (GPT-J pairs), written into the caller's buffer.
This is what `torch_path.sparse_attention_sink` computes (candidates gathered, then
`torch_path.sparse_attention`, then `apply_rotary(inverse=True)`), without gathering candidates:

- a window row comes from this step's own kv where the RingIndex says `in_step`, else from the ring
  `window.view(-1, D)[ring_row]`; `valid` masks positions before 0 (the window loop);
- compressed rows come from `compressed[slot[t], idx]`; the count a token reads is min(C, n_done[t]),
  read from device memory, so the loop stops there (picks are packed: valid picks first, then -1) (the
  compressed-row loop: one address per row; the next tile's rows, or FP8 codes, are copied ahead, FP8
  scale bytes, too small for an async copy, are plain loads);
- each tile of BLOCK_N gathered rows feeds tensor-core dots as two halves of the head dim (s = q_lo . lo
  + q_hi . hi, then P @ lo and P @ hi), so that a value split may give each half to its own program;
- the online softmax runs in fp32, in base 2 (the scale carries log2(e)), with the sink as the initial
  running max and denominator 1, so it enters the denominator only;
- where one program per (token, block of heads) leaves the GPU mostly idle (decode at small batch),
  the candidates are split over programs (flash-decoding) and a second kernel combines the splits,
  adds the sink and applies the inverse rotary.

With FP8 caches (uint8 kv, window and compressed rows in the layout of ops/cache_fp8.py) the kernel reads
each candidate's e4m3 bytes, its scale bytes and its bf16 rope bytes in place and dequantizes in registers
(exact in the run dtype), the same values torch_path's gather-then-dequantize gives. Row offsets carry
the host-checked alignment of the row strides (`row_align`; 16 bytes for 592-byte rows), so rows load as
vectors rather than byte by byte.

Every size the kernels branch on comes from device tensors or from host ints fixed for a shape (T,
C): capturable in a CUDA graph. Configurations are fixed per shape (no autotuning). For many tokens on
Hopper, `attn_config` picks the Gluon kernel of ops/sparse_attention_wgmma.py instead (same arguments and
semantics; `AttnConfig.kernel`).

PDL (ops/kernel_support.py): the attention kernel waits before its first load (q, this step's kv rows,
the RingIndex rows, the picks and counts, the caches: all written earlier in the step) and triggers after
its last (the last block of candidates; without a split the angles of the inverse rotary), before its
stores; the combine kernel waits before the partials, the attention kernel's output, and triggers after
the angles, before its store.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tp_runtime.ops.cache_fp8 import load_rows
from tp_runtime.ops.index import RingIndex
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, row_align, sm_count, tl, triton
from tp_runtime.ops.rope import rotate_pairs
from tp_runtime.ops.sparse_attention_wgmma import FEW_HEADS, sparse_attention_wgmma, wgmma_attention_fits
from tp_runtime.ops.sparse_attention_ws_wgmma import sparse_attention_ws


LOG2E = 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e)), one multiply folded into the scale
_LOG2E = tl.constexpr(LOG2E) if tl is not None else LOG2E  # the kernels' copy (a Triton global is a constexpr)


@jit
def _rows(ptr, d, ok, D0, D: tl.constexpr, DR: tl.constexpr, FP8: tl.constexpr, DTYPE: tl.constexpr,
          ROPE: tl.constexpr):
    """Dims d = D0 + arange(HALF) of the gathered rows at ptr [N] -> [N, HALF] in DTYPE, zero where not ok or
    d >= D (FP8 rows: decoded in registers, exact; ROPE False: d holds no rope dim, whose load is left out)."""
    if FP8:
        r = load_rows(ptr, d, ok, D - DR, DR, DTYPE, D0, ROPE)
    else:
        r = tl.load(ptr[:, None] + d[None, :], mask=ok[:, None] & (d < D)[None, :], other=0.0)
    return r


@jit
def _tile(q_own, q_oth, ptr, ok, v0, v1, m, den, acc_own, acc_oth, qk_scale,
          D: tl.constexpr, DR: tl.constexpr, FP8: tl.constexpr, VSPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of BLOCK_N gathered rows into the online softmax of BLOCK_H heads (base 2).

    The row's dims come as two halves: `own` (v0 + arange(HALF), the values this program accumulates) and
    `oth` (the other half, v1 + ...). Scores are s = q_own . own + q_oth . oth: with the value dims split
    over two programs (VSPLIT = 2) both compute the same two dots and add them (commutative: the same bits),
    so their softmax statistics agree exactly."""
    HALF: tl.constexpr = q_own.shape[1]
    dt = q_own.dtype
    # without a value split the own half is the lower one, which holds no rope dim (D - DR >= HALF)
    r_own = _rows(ptr, v0 + tl.arange(0, HALF), ok, v0, D, DR, FP8, dt, VSPLIT == 2)  # [BLOCK_N, HALF]
    r_oth = _rows(ptr, v1 + tl.arange(0, HALF), ok, v1, D, DR, FP8, dt, True)
    s = (tl.dot(q_own, tl.trans(r_own), input_precision=PRECISION)
         + tl.dot(q_oth, tl.trans(r_oth), input_precision=PRECISION)) * qk_scale  # [BLOCK_H, BLOCK_N], log2 units
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    den = den * alpha + tl.sum(p, axis=1)
    acc_own = tl.dot(p.to(dt), r_own, acc_own * alpha[:, None], input_precision=PRECISION)
    if VSPLIT == 1:
        acc_oth = tl.dot(p.to(dt), r_oth, acc_oth * alpha[:, None], input_precision=PRECISION)
    return m_new, den, acc_own, acc_oth


@jit
def _sparse_attn_kernel(
    q_ptr, sq_t, sq_h,  # q [T, H, D], last dim contiguous
    kv_ptr, skv_t,  # this step's window rows [T, D] (FP8: uint8 [T, row bytes])
    win_ptr, swin,  # window ring viewed as [slots * W, D] (FP8: [slots * W, row bytes])
    in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,  # RingIndex rows [T, W]
    comp_ptr, sc_slot, sc_row,  # compressed rows [slots, N, D] (FP8: [slots, N, row bytes])
    slot_ptr,  # [T] long
    picks_ptr, s_pk,  # [T, C] long, -1 = none (ratio 4)
    n_done_ptr,  # [T] long: completed entries (ratio 4 and 128)
    sink_ptr,  # [H] fp32
    cis_ptr, s_cis,  # [T, DR/2, 2] fp32
    out_ptr, s_out,  # [T, H * D]
    part_o_ptr, part_ml_ptr,  # [T, S, H, BLOCK_D] fp32, [T, S, H, 2] fp32 (split; m in log2 units)
    H, C, qk_scale, n_splits, split_len,
    W: tl.constexpr, D: tl.constexpr, DR: tl.constexpr,
    HAS_COMP: tl.constexpr, HAS_PICKS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, VSPLIT: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr, ROW_ALIGN: tl.constexpr, PDL: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_D // 2
    t = tl.program_id(0)
    hb = tl.program_id(1) // VSPLIT
    v = tl.program_id(1) % VSPLIT  # which half of the value dims this program accumulates (VSPLIT = 2)
    sp = tl.program_id(2)
    v0 = v * HALF  # first dim of the own half; the other half starts at v1
    v1 = HALF - v0
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    dh = tl.arange(0, HALF)
    pdl_wait(PDL)
    q_row = q_ptr + t * sq_t + heads[:, None] * sq_h
    q_own = tl.load(q_row + (v0 + dh)[None, :], mask=hmask[:, None] & ((v0 + dh) < D)[None, :], other=0.0)
    q_oth = tl.load(q_row + (v1 + dh)[None, :], mask=hmask[:, None] & ((v1 + dh) < D)[None, :], other=0.0)

    total = W
    if HAS_COMP:
        total += tl.minimum(tl.load(n_done_ptr + t), C)  # candidates this token reads (device count)
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, total)
    slot = tl.load(slot_ptr + t)

    if not SPLIT:  # the sink: initial running max, denominator exp2(sink - sink) = 1
        m = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * _LOG2E
        den = tl.full([BLOCK_H], 1.0, tl.float32)
    else:  # a split's partial softmax; the combine adds the sink
        m = tl.full([BLOCK_H], -1.0e30, tl.float32)
        den = tl.zeros([BLOCK_H], tl.float32)
    acc_own = tl.zeros([BLOCK_H, HALF], tl.float32)
    acc_oth = tl.zeros([BLOCK_H, HALF], tl.float32)

    # Window rows (candidates 0 .. W-1): this step's own rows where the RingIndex says in_step, else the ring.
    for start in range(lo, tl.minimum(hi, W), BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        live = j < tl.minimum(hi, W)
        ins = tl.load(in_step_ptr + t * s_in + j, mask=live, other=0) != 0
        srow = tl.load(step_row_ptr + t * s_sr + j, mask=live & ins, other=0)
        rrow = tl.load(ring_row_ptr + t * s_rr + j, mask=live & (~ins), other=0)
        ok = live & (tl.load(valid_ptr + t * s_va + j, mask=live, other=0) != 0)
        # every row offset is a multiple of ROW_ALIGN elements (host-checked): the row loads are vectors
        ptr = tl.where(ins, kv_ptr + tl.multiple_of(srow * skv_t, ROW_ALIGN),
                       win_ptr + tl.multiple_of(rrow * swin, ROW_ALIGN))
        m, den, acc_own, acc_oth = _tile(q_own, q_oth, ptr, ok, v0, v1, m, den, acc_own, acc_oth, qk_scale,
                                         D, DR, FP8, VSPLIT, PRECISION)

    # Compressed rows (candidates W .. total-1): the indexer's picks (ratio 4) or every completed entry.
    if HAS_COMP:
        # the slot's offset carries the rows' alignment too: without it the FP8 codes' loads are not known
        # to be vectors, and the pipeliner leaves them as plain loads, none in flight ahead
        base = comp_ptr + tl.multiple_of(slot * sc_slot, ROW_ALIGN)
        for start in range(tl.maximum(lo, W), hi, BLOCK_N):
            c = start - W + tl.arange(0, BLOCK_N)
            live = c < hi - W
            if HAS_PICKS:
                idx = tl.load(picks_ptr + t * s_pk + c, mask=live, other=-1)
                ok = live & (idx >= 0)
                idx = tl.maximum(idx, 0)
            else:
                idx = c.to(tl.int64)
                ok = live
            ptr = base + tl.multiple_of(idx * sc_row, ROW_ALIGN)
            m, den, acc_own, acc_oth = _tile(q_own, q_oth, ptr, ok, v0, v1, m, den, acc_own, acc_oth, qk_scale,
                                             D, DR, FP8, VSPLIT, PRECISION)

    if not SPLIT:  # the upper half first: its inverse rotary reads the angles, the last load before the trigger
        if VSPLIT == 1:
            _finish(acc_oth, den, v1, True, cis_ptr + t * s_cis, out_ptr + t * s_out, heads, hmask, D, DR, PDL)
            _finish(acc_own, den, v0, False, cis_ptr + t * s_cis, out_ptr + t * s_out, heads, hmask, D, DR, False)
        else:
            _finish(acc_own, den, v0, v == 1, cis_ptr + t * s_cis, out_ptr + t * s_out, heads, hmask, D, DR, PDL)
    else:
        pdl_trigger(PDL)
        row = (t * n_splits + sp) * H + heads  # [BLOCK_H]
        tl.store(part_o_ptr + row[:, None] * BLOCK_D + (v0 + dh)[None, :], acc_own, mask=hmask[:, None])
        if VSPLIT == 1:
            tl.store(part_o_ptr + row[:, None] * BLOCK_D + (v1 + dh)[None, :], acc_oth, mask=hmask[:, None])
        first = v == 0  # both halves hold the same statistics; one writes them
        tl.store(part_ml_ptr + row * 2, m, mask=hmask & first)
        tl.store(part_ml_ptr + row * 2 + 1, den, mask=hmask & first)


@jit
def _finish(acc, den, d0, upper, cis_row, out_row, heads, hmask, D: tl.constexpr, DR: tl.constexpr,
            PDL: tl.constexpr):
    """o = acc / den for dims d0 + arange(HALF) of BLOCK_H heads; the upper half (which holds the last DR
    dims: D - DR >= HALF, host-checked) gets the inverse rotary; stored in out's dtype."""
    BLOCK_H: tl.constexpr = acc.shape[0]
    HALF: tl.constexpr = acc.shape[1]
    o = acc / den[:, None]
    if upper:  # the rotary dims [D - DR, D) lie in dims [HALF, 2*HALF): as dims [D - HALF - DR, D - HALF) here
        o = rotate_pairs(o, cis_row, BLOCK_H, HALF, D - HALF, DR, True)
    pdl_trigger(PDL)
    d = d0 + tl.arange(0, HALF)
    tl.store(out_row + heads[:, None] * D + d[None, :], o.to(out_row.dtype.element_ty),
             mask=hmask[:, None] & (d < D)[None, :])


@jit
def _combine_kernel(
    part_o_ptr, part_ml_ptr,  # [T, S, H, BLOCK_D], [T, S, H, 2] fp32 (m in log2 units)
    sink_ptr, cis_ptr, s_cis, out_ptr, s_out, H, n_splits,
    D: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_P2: tl.constexpr,
    PDL: tl.constexpr,
):
    """The splits of BLOCK_H heads of a token summed: every split's partials loaded at once ([SPLITS_P2,
    BLOCK_H, BLOCK_D], one round trip to memory: this kernel's time at small batch is latency), the sink
    added, o / den rotated back and stored."""
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    d = tl.arange(0, BLOCK_D)
    sp = tl.arange(0, SPLITS_P2)
    row = (t * n_splits + sp[:, None]) * H + heads[None, :]  # [SPLITS_P2, BLOCK_H] partial rows
    live = (sp < n_splits)[:, None] & hmask[None, :]
    pdl_wait(PDL)
    sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * _LOG2E
    pm = tl.load(part_ml_ptr + row * 2, mask=live, other=-1.0e30)
    pden = tl.load(part_ml_ptr + row * 2 + 1, mask=live, other=0.0)
    po = tl.load(part_o_ptr + row[:, :, None] * BLOCK_D + d[None, None, :], mask=live[:, :, None], other=0.0)
    m = tl.maximum(sink, tl.max(pm, axis=0))  # [BLOCK_H]
    w = tl.exp2(pm - m[None, :])  # [SPLITS_P2, BLOCK_H]: a split's weight (0 for rows past n_splits)
    den = tl.exp2(sink - m) + tl.sum(w * pden, axis=0)
    acc = tl.sum(w[:, :, None] * po, axis=0)  # [BLOCK_H, BLOCK_D]
    o = rotate_pairs(acc / den[:, None], cis_ptr + t * s_cis, BLOCK_H, BLOCK_D, D, DR, True)
    pdl_trigger(PDL)
    tl.store(out_ptr + t * s_out + heads[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=hmask[:, None] & (d < D)[None, :])


class AttnConfig(NamedTuple):
    """Launch configuration of the attention kernel (fixed per shape; see `attn_config`)."""

    block_h: int  # heads a program (the dots' M; at least 16)
    block_n: int  # gathered rows a tile
    num_warps: int
    num_stages: int
    split_len: int  # candidates per split (a multiple of block_n); >= W + C: no split
    value_split: int = 1  # 2: the value dims' halves in two programs (each scores whole rows, keeps half the acc)
    kernel: str = "triton"  # "wgmma": ops/sparse_attention_wgmma.py (64 heads a program, block_n rows, no split);
    # "wgmma_ws": ops/sparse_attention_ws_wgmma.py (FP8 rows; heads padded to 64, 64-row tiles, no split)


def attn_config(n_tokens: int, n_heads: int, n_cand: int, head_dim: int, n_sm: int, fp8: bool = False,
                fp32: bool = False, wgmma: bool = False) -> AttnConfig:
    """The configuration for T tokens, Hl heads, up to n_cand = W + C candidates of head_dim dims.

    Programs: T x ceil(Hl / block_h) x value_split x splits. From the H200 sweeps at Flash dims, 4K context
    (benchmarks/attention_sweep.py; results/h200-2026-12-02-attention, -attention-stages and
    -2026-12-04-attention-splits), three regimes:
    - few tokens (T x ceil(Hl / 16) x 8 <= SMs; decode at batch 1-4 with 64 heads, 1-16 on an 8-head shard):
      `_few_tokens`, 16 heads a program, 8 warps, one tile a program and so one stage: 32-row tiles where
      those programs fit on the SMs at once, else 64-row ones. The fixed cost of a program (q, index loads,
      partials) is what these steps pay; a one-tile program without the pipeliner's prologue is a smaller
      kernel (Nsight Compute at batch 1: 24 % of stalls were instruction fetches). Batch 1, 64 heads, us a
      layer, ratio 4 / 128, bf16 then FP8 rows: 15.9 / 15.3 and 17.6 / 17.4 with 64-row splits in 2 stages,
      13.6 / 13.0 and 15.2 / 14.8 now.
    - many tokens (T x ceil(Hl / 64) x 2 >= SMs): every head of a token in one program of 8 warps (each
      gathered row read and decoded once), no split (a split's combine and partial stores cost more than the
      idle SMs of the last wave). See `_many_tokens`.
    - between: split to fill the SMs once; many candidates (ratio 4): all heads a program, 8 warps (each row
      read and decoded once) for FP8 rows and for bf16 rows up to 16 such programs (batch 8 / 16, 64 heads:
      26.9 -> 22.6 / 35.2 -> 28.0 us against 16 heads in 32-row tiles, 4 warps, 3 stages, which bf16 rows keep
      beyond: batch 32, 45.9 against 54.9); few candidates (ratio 128): 16 heads in 64-row tiles, 8 warps,
      split to fill the SMs twice where the programs fill under half of them, else not split (batch 8 / 32,
      bf16 rows: 22.7 -> 16.4 / 29.7 -> 21.5 us).
    In every regime that splits, a split of one tile runs one stage (no loop for the pipeliner to overlap).
    Stages: Triton's pipeliner splits `num_stages - 1` between the index loads and the gathers they address,
    and gives direct loads (ratio 128's rows) all of it: 5 stages ring 4 tiles there, so a tile is at most
    32 bf16 rows of 512 dims beside 64 heads' q (192 KB of shared memory).
    The value split (value_split 2) never won at Flash dims and stays off.
    wgmma (the layer fits ops/sparse_attention_wgmma.py's kernel on a Hopper GPU): that kernel in the
    many-token regime, 64-row tiles in 2 stages, both row formats (results/h200-2026-12-03-attention-wgmma:
    1.88 / 1.94x the Triton kernel with bf16 / FP8 rows at batch 128, ratio 4; 1.35 / 1.65x at ratio 128;
    1.38x at 8 heads; 32-row tiles in 3 or 4 stages lost everywhere). fp32 (the checks' dtype; tiles of twice
    the bytes): 32 heads a program, 32 / 64 candidates a block with / without FP8 rows.
    wgmma_ws: FP8 rows with more than FEW_HEADS heads in the many-token regime on Hopper,
    ops/sparse_attention_ws_wgmma.py (the decode off the products' path; results/h200-2026-12-04-attention-ws:
    53.7 / 55.6 us at batch 128, ratio 4, 64 heads; 24.8 / 26.4 at ratio 128; 52.2 / 53.5 at 32 heads; it lost
    at 8 and 16 heads, 51.2 / 43.4 us)."""
    wide = head_dim >= 256
    h16 = max(16, min(64, triton.next_power_of_2(n_heads)))  # all of a token's heads (16 at least: the dot's M)
    if not wide:
        cfg, fill = AttnConfig(16, 16, 4, 2, 0), 1
    elif fp32:
        cfg, fill = AttnConfig(16 if n_heads <= 16 else 32, 32 if fp8 else 64, 8, 2, 0), 1
    elif n_tokens * triton.cdiv(n_heads, 16) * 8 <= n_sm:
        return _few_tokens(n_tokens, n_heads, n_cand, n_sm)
    elif n_tokens * triton.cdiv(n_heads, 64) * 2 >= n_sm:
        if wgmma:
            return WGMMA_WS if fp8 and n_heads > FEW_HEADS else WGMMA
        return _many_tokens(h16, n_cand, fp8)
    elif n_cand >= 512 and (fp8 or n_tokens * triton.cdiv(n_heads, h16) <= 16):
        cfg, fill = AttnConfig(h16, 32, 8, 2, 0), 1
    elif n_cand >= 512:
        cfg, fill = AttnConfig(16, 32, 4, 3, 0), 1
    else:  # split to fill the SMs twice where the programs fill under half of them, else not at all
        cfg, fill = AttnConfig(16, 64, 8, 2, 0), 2
        if n_tokens * triton.cdiv(n_heads, 16) * 2 > n_sm:
            return cfg._replace(split_len=triton.cdiv(n_cand, 64) * 64)
    bn = cfg.block_n
    base = n_tokens * triton.cdiv(n_heads, cfg.block_h)
    splits = 1 if base >= n_sm else max(1, min(triton.cdiv(n_cand, 64), triton.cdiv(n_sm * fill, base)))
    split_len = triton.cdiv(triton.cdiv(n_cand, splits), bn) * bn
    # a program of one tile has no loop to pipeline: one stage (a smaller kernel, no pipeline prologue)
    return cfg._replace(split_len=split_len, num_stages=1 if split_len == bn else cfg.num_stages)


def _few_tokens(n_tokens: int, n_heads: int, n_cand: int, n_sm: int) -> AttnConfig:
    """attn_config's few-token regime: 16 heads a program, 8 warps, a split of one tile a program (so one stage:
    no loop to pipeline), 32-row tiles where those programs fit on the SMs at once, else 64-row ones."""
    bn = 32 if n_tokens * triton.cdiv(n_heads, 16) * triton.cdiv(n_cand, 32) <= n_sm else 64
    return AttnConfig(16, bn, 8, 1, bn)


def _many_tokens(h16: int, n_cand: int, fp8: bool) -> AttnConfig:
    """attn_config's many-token regime (H200, Flash dims, 4K; decode at batch 128, prefill chunks of 2,048):
    - bf16 rows, 64 heads, many candidates (ratio 4): 64-row tiles, 2 stages (decode 80.8 us; 32-row tiles
      with 5 stages, 79.7, lose 11 % on prefill chunks: 1.12 against 1.00 ms);
    - bf16 rows, 64 heads, few candidates (ratio 128): 32-row tiles, 5 stages (decode 31.7 us, 33.8 with 2;
      batch 256: 57.7 against 61.4; prefill within 3 %);
    - bf16 rows, 16 or 32 heads a program: 64-row tiles, 2 stages (8 heads, rank 0 of tp 8: 55.2 us; 5
      stages gained 9 % at ratio 4 but ring 4 x 64 KB tiles at ratio 128, more than the shared memory);
    - FP8 rows: 64-row tiles, 2 stages with many candidates (ratio 4: 135 us); 32-row tiles, 3 stages with
      few (ratio 128: 48.3 us, 59.6 with 2)."""
    if fp8:
        bn, stages = (64, 2) if n_cand >= 512 else (32, 3)
    elif h16 == 64 and n_cand < 512:
        bn, stages = 32, 5
    else:
        bn, stages = 64, 2
    return AttnConfig(h16, bn, 8, stages, triton.cdiv(n_cand, bn) * bn)


# the Gluon kernel's one configuration: 64 heads, two stages of 64 rows, 8 warps, never split
WGMMA = AttnConfig(64, 64, 8, 2, 1 << 30, kernel="wgmma")
# the warp-specialized Gluon kernel for FP8 rows: 64 heads, a ring of two 64-row tiles, 3 warpgroups, never split
WGMMA_WS = AttnConfig(64, 64, 4, 2, 1 << 30, kernel="wgmma_ws")

COMBINE_HEADS = 1  # heads per program of the combine: T x Hl programs sum the splits in parallel


def sparse_attention_sink(q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, ring: "RingIndex",
                          compressed: torch.Tensor | None, slot: torch.Tensor, picks: torch.Tensor | None,
                          n_done: torch.Tensor | None, n_comp: int, sink: torch.Tensor, scale: float,
                          cis: torch.Tensor, out: torch.Tensor, config: AttnConfig | None = None,
                          pdl: bool = False) -> None:
    """Attention of T tokens over their window and compressed rows, inverse rotary, into out [T, Hl*D].

    q [T, Hl, D] (normed, roped); kv [T, D] this step's rows (the ring must not yet hold them);
    window [slots, W, D] (FP8 caches: kv, window and compressed are uint8 rows of row bytes); ring: the
    RingIndex of W rows for these T tokens; compressed [slots, N, D] or None (window-only layer); slot [T];
    picks [T, C] (ratio 4, -1 = none, valid first) or None (ratio 128: every entry < n_done[t], at most
    n_comp); n_done [T] completed entries; n_comp: C, the host bound on compressed candidates; sink [Hl]
    fp32; cis [T, Dr/2] complex64 at pos; pdl: both launches with programmatic dependent launch (resolve_pdl;
    bitwise the same output).
    """
    T, H, D = q.shape
    if T == 0:
        return
    W = window.shape[1]
    dr = 2 * cis.shape[-1]
    has_comp = compressed is not None and n_comp > 0
    C = n_comp if has_comp else 0
    fp8 = window.dtype == torch.uint8
    wgmma = wgmma_attention_fits(q.device, H, D, 2 * cis.shape[-1], q.dtype)
    cfg = config or attn_config(T, H, W + C, D, sm_count(q.device), fp8, q.dtype == torch.float32, wgmma)
    n_hb = triton.cdiv(H, cfg.block_h)
    splits = triton.cdiv(W + C, cfg.split_len)
    block_d = max(32, triton.next_power_of_2(D))
    # the inverse rotary runs on the upper half of the dims alone
    assert D - dr >= block_d // 2, f"rotary dims {dr} must lie in the upper half of {block_d}"
    assert q.stride(2) == 1 and kv.stride(1) == 1 and window.is_contiguous() and out.stride(1) == 1
    cis_r = torch.view_as_real(cis)  # [T, Dr/2, 2] fp32
    assert kv.dtype == window.dtype and (compressed is None or compressed.dtype == window.dtype)
    win = window.view(-1, window.shape[-1])
    comp = compressed if has_comp else window
    pk = picks if (has_comp and picks is not None) else slot[:, None]
    nd = n_done if has_comp else slot
    if cfg.kernel == "wgmma_ws":
        assert wgmma and fp8, "the wgmma_ws attention kernel needs the wgmma kernel's conditions and FP8 rows"
        sparse_attention_ws(q, kv, win, ring, comp, slot, pk, nd, has_comp, picks is not None, C, W, sink,
                            scale * LOG2E, cis_r, out, pdl)
        return
    if cfg.kernel == "wgmma":
        assert wgmma, "the wgmma attention kernel needs a Hopper GPU, Gluon, 16-bit q, 512 dims (64 rope), <= 64 heads"
        sparse_attention_wgmma(q, kv, win, ring, comp, slot, pk, nd, has_comp, picks is not None, C, W, sink,
                               scale * LOG2E, cis_r, out, cfg.block_n, cfg.num_stages, pdl)
        return
    if splits > 1:
        part_o = torch.empty(T, splits, H, block_d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(T, splits, H, 2, dtype=torch.float32, device=q.device)
    else:
        part_o = part_ml = sink  # unused
    u8 = torch.uint8
    _sparse_attn_kernel[(T, n_hb * cfg.value_split, splits)](
        q, q.stride(0), q.stride(1), kv, kv.stride(0), win, win.stride(0),
        ring.in_step.view(u8), ring.in_step.stride(0), ring.step_row, ring.step_row.stride(0),
        ring.ring_row, ring.ring_row.stride(0), ring.valid.view(u8), ring.valid.stride(0),
        comp, comp.stride(0), comp.stride(1), slot, pk, pk.stride(0), nd, sink, cis_r, cis_r.stride(0),
        out, out.stride(0), part_o, part_ml, H, C, scale * LOG2E, splits, cfg.split_len,
        W=W, D=D, DR=dr, HAS_COMP=has_comp, HAS_PICKS=picks is not None,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_D=block_d, VSPLIT=cfg.value_split, SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FP8=fp8,
        ROW_ALIGN=row_align(kv.stride(0), win.stride(0), comp.stride(0), comp.stride(1)), PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl)
    if splits > 1:
        sp2 = triton.next_power_of_2(splits)  # a program holds sp2 x block_d partials: 64 a thread up to 64 splits
        _combine_kernel[(T, triton.cdiv(H, COMBINE_HEADS))](
            part_o, part_ml, sink, cis_r, cis_r.stride(0), out, out.stride(0), H, splits,
            D=D, DR=dr, BLOCK_H=COMBINE_HEADS, BLOCK_D=block_d, SPLITS_P2=sp2, PDL=pdl,
            num_warps=min(16, max(4, sp2 * COMBINE_HEADS * block_d // 2048)), launch_pdl=pdl)
