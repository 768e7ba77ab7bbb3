"""Gated-pooling compressor, stage B, in two kernels (Triton): pool + norm + rotary + store, then the state write.

For token t at position p of a sequence with compress ratio r (c = 2 for r = 4, else 1; R = c*r rows;
C = c*D channels of stage A's projections kv, score [T, C]) the entry of block i = p // r is

    rows j = 0 .. R-1 at positions p - R + 1 + j (oldest first): this step's row where the RingIndex
        says in_step (score + ape[(p - R + 1 + j) % r]), else the state ring's row (score + ape stored);
        score -inf where the position is < 0
    channel d of row j is column d + D*(j >= r) with overlap (block i-1's rows use [0, D), block i's
        [D, 2D)), column d without
    pooled[d] = sum_j softmax_j(score[j, d]) * kv[j, d]                                   [D] fp32
    y = w * pooled * rsqrt(mean(pooled^2) + eps),  pairs (2k, 2k+1) of its last Dr dims turned by cis[t]
    out[emit_slot[t], i] = y in out's dtype, or with FP8 caches (uint8 out) y quantized from fp32 into the
        layout `store` names: "row" (e4m3 nope + bf16 rope + e8m0 scales) or "key" (the e4m3 codes into out,
        the key's fp32 scale into scales[emit_slot[t], i])

which is `torch_path.compress_pool`. Only tokens that complete their block (emit_slot is not the
trash slot, the last slot of out) do this work; the others return at once and leave the trash slot
alone (the torch path writes garbage there; nothing reads it for a real token). The pooling runs as an
online softmax over blocks of rows, fp32 throughout; the in-step rows are rounded to the ring's dtype
first, as `torch_path.gather_rows` does (a no-op for the fp32 rings the caches hold).

The second kernel stores every token's kv row and score + ape row at RingIndex.write_row, both rings in
one launch. It must follow the first: in a prefill chunk a later token of a sequence overwrites ring
rows that earlier tokens of the chunk still read (stream order does it).

kv and score may be column views of a wider GEMM output (any row stride, last dim contiguous), in
bf16, fp16 or fp32. Grids are (T,); every other size is a constexpr or a host int fixed for the cache's
shape (the trash index), and per-token values are read from device memory: capturable in a CUDA graph.
Configurations are fixed per shape (no autotuning).

PDL (ops/kernel_support.py): both kernels wait before their first load, since everything they read may be
a predecessor's: the BlockIndex and RingIndex rows (computed by the step index's kernels inside a full
graph), kv and score (the GEMM's output), the rings and caches. The pool kernel triggers after its last
load (the block number, after the pooled rows, the weight and the angles), before its store; the state
kernel after its row's loads, before the ring writes. The state kernel overwrites ring rows the pool
kernel reads: its wait, before any access, keeps that order under PDL too.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.cache_fp8 import store_key, store_row
from tp_runtime.ops.index import BlockIndex, RingIndex, RingState
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton
from tp_runtime.ops.rope import rotate_pairs


TILE = 4096  # elements of one [BLOCK_R, BLOCK_D] tile of rows: 16 fp32 per thread at 8 warps


@jit
def _pool_kernel(
    kv_ptr, s_kv, score_ptr, s_sc,  # this step's projections [T, C], last dim contiguous
    ape_ptr,  # [r, C] fp32
    ring_kv_ptr, ring_sc_ptr,  # state rings viewed as [slots * R, C], contiguous
    in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,  # RingIndex rows [T, R]
    phase_ptr, block_ptr, emit_ptr,  # BlockIndex [T] long each
    w_ptr,  # norm weight [D]
    cis_ptr, s_cis,  # [T, DR/2, 2] fp32: rotary at block * r
    out_ptr, so_slot, so_row,  # out [slots + 1, N, D], last dim contiguous (FP8: uint8 [slots + 1, N, NB])
    sc_ptr, ss_slot, ss_row,  # STORE == 2: the keys' scales [slots + 1, N] fp32
    trash, eps,
    RATIO: tl.constexpr, R: tl.constexpr, C: tl.constexpr, D: tl.constexpr, DR: tl.constexpr,
    OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, STORE: tl.constexpr, NB: tl.constexpr,
    PDL: tl.constexpr,
):
    t = tl.program_id(0)
    pdl_wait(PDL)
    slot = tl.load(emit_ptr + t)
    if slot != trash:  # the token completes its block
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        phase = tl.load(phase_ptr + t)
        m = tl.full([BLOCK_D], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_D], tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for r0 in tl.static_range(0, R, BLOCK_R):
            j = r0 + tl.arange(0, BLOCK_R)  # rows [BLOCK_R], oldest first
            ins = tl.load(in_step_ptr + t * s_in + j) != 0
            ok = tl.load(valid_ptr + t * s_va + j) != 0
            srow = tl.load(step_row_ptr + t * s_sr + j)
            rrow = tl.load(ring_row_ptr + t * s_rr + j)
            if OVERLAP:  # block i-1's rows give channels [0, D), block i's [D, 2D)
                col = tl.where(j >= RATIO, D, 0)[:, None] + d[None, :]
            else:
                col = tl.zeros([BLOCK_R], tl.int32)[:, None] + d[None, :]
            new = (ok & ins)[:, None] & dm[None, :]  # [BLOCK_R, BLOCK_D]
            old = (ok & (~ins))[:, None] & dm[None, :]
            # this step's rows: stage A's dtype -> the ring's dtype (as gather_rows) -> fp32; score + ape
            ph = (phase + 1 + j) % RATIO  # the row's position mod r (R is a multiple of r)
            x_new = tl.load(kv_ptr + srow[:, None] * s_kv + col, mask=new, other=0.0).to(tl.float32)
            g_new = (tl.load(score_ptr + srow[:, None] * s_sc + col, mask=new, other=0.0).to(tl.float32)
                     + tl.load(ape_ptr + ph[:, None] * C + col, mask=new, other=0.0))
            x_new = x_new.to(ring_kv_ptr.dtype.element_ty).to(tl.float32)
            g_new = g_new.to(ring_sc_ptr.dtype.element_ty).to(tl.float32)
            x_old = tl.load(ring_kv_ptr + rrow[:, None] * C + col, mask=old, other=0.0).to(tl.float32)
            g_old = tl.load(ring_sc_ptr + rrow[:, None] * C + col, mask=old, other=0.0).to(tl.float32)
            x = tl.where(ins[:, None], x_new, x_old)
            g = tl.where(ok[:, None], tl.where(ins[:, None], g_new, g_old), float("-inf"))
            # online softmax over rows; a block of only -inf rows (block -1) adds nothing
            m_new = tl.maximum(m, tl.max(g, axis=0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_use)
            p = tl.exp(g - m_use[None, :])
            den = den * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p * x, axis=0)
            m = m_new
        pooled = tl.where(dm, acc / den, 0.0)  # [BLOCK_D]; a completing token has >= r valid rows
        w = tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
        y = pooled * (1.0 / tl.sqrt(tl.sum(pooled * pooled, axis=0) / D + eps)) * w
        y = tl.reshape(rotate_pairs(tl.reshape(y, (1, BLOCK_D)), cis_ptr + t * s_cis, 1, BLOCK_D, D, DR, False),
                       (BLOCK_D,))
        blk = tl.load(block_ptr + t)
        pdl_trigger(PDL)
        dst = out_ptr + slot * so_slot + blk * so_row
        if STORE == 1:  # FP8 attention row
            store_row(dst, tl.where(dm, y, 0.0), D - DR, DR, BLOCK_D, NB)
        elif STORE == 2:  # FP8 indexer key: codes into out, the scale into scales
            store_key(dst, sc_ptr + slot * ss_slot + blk * ss_row, tl.where(dm, y, 0.0), D, BLOCK_D)
        else:
            tl.store(dst + d, y.to(out_ptr.dtype.element_ty), mask=dm)


@jit
def _state_kernel(
    kv_ptr, s_kv, score_ptr, s_sc,  # this step's projections [T, C], last dim contiguous
    ape_ptr, phase_ptr,  # [r, C] fp32, [T] long
    write_ptr,  # [T] long: RingIndex.write_row
    ring_kv_ptr, ring_sc_ptr,  # state rings viewed as [slots * R, C], contiguous
    C: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):
    t = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    cm = c < C
    pdl_wait(PDL)
    row = tl.load(write_ptr + t)
    phase = tl.load(phase_ptr + t)
    kv = tl.load(kv_ptr + t * s_kv + c, mask=cm, other=0.0).to(tl.float32)
    g = tl.load(score_ptr + t * s_sc + c, mask=cm, other=0.0).to(tl.float32) + tl.load(ape_ptr + phase * C + c,
                                                                                       mask=cm, other=0.0)
    pdl_trigger(PDL)
    tl.store(ring_kv_ptr + row * C + c, kv.to(ring_kv_ptr.dtype.element_ty), mask=cm)
    tl.store(ring_sc_ptr + row * C + c, g.to(ring_sc_ptr.dtype.element_ty), mask=cm)


def compress_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, weight: torch.Tensor, eps: float,
                  blk: BlockIndex, ring: RingIndex, state: RingState, out: torch.Tensor, store: str = "plain",
                  scales: torch.Tensor | None = None, pdl: bool = False) -> None:
    """Stage B of a compressor for T tokens: the entries of tokens that complete a block into out, then
    this step's rows into the state rings. Two launches.

    kv, score [T, C] (stage A's projections, C = c*D, last dim contiguous, bf16 / fp16 / fp32);
    ape [r, C] fp32; weight [D] the norm's; blk: the BlockIndex of ratio r; ring: the RingIndex of
    R = c*r rows; state: rings [slots + 1, R, C]; out [slots + 1, N, D], its last slot the trash slot;
    store: "plain" (out's dtype), "row" / "key" (FP8 into a uint8 out, as torch_path.compress_pool stores them);
    scales: with store "key" the keys' scales fp32 [slots + 1, N] (out: their e4m3 codes [slots + 1, N, D]),
    else None.
    pdl: both launches with programmatic dependent launch (resolve_pdl; bitwise the same outputs).
    The signature and meaning of `torch_path.compress_pool` (and pdl).
    """
    T = kv.shape[0]
    if T == 0:
        return
    ratio, C = ape.shape
    D, R = weight.shape[0], ring.valid.shape[1]
    assert (store == "plain") == (out.dtype != torch.uint8), (store, out.dtype)
    assert (store == "key") == (scales is not None), (store, scales)
    dr = 2 * blk.cis.shape[-1]
    assert C in (D, 2 * D) and R == C // D * ratio, (ape.shape, out.shape, ring.valid.shape)
    assert kv.stride(1) == 1 and score.stride(1) == 1 and out.stride(2) == 1 and ape.is_contiguous()
    assert state.kv.is_contiguous() and state.score.is_contiguous() and weight.is_contiguous()
    assert all(x.stride(1) == 1 for x in ring[:4]) and all(x.stride(0) == 1 for x in blk[:3])
    ring_kv, ring_sc = state.kv.view(-1, C), state.score.view(-1, C)
    cis = torch.view_as_real(blk.cis)  # [T, Dr/2, 2] fp32
    assert cis.stride(1) == 2
    block_d = triton.next_power_of_2(D)
    block_r = min(R, max(1, TILE // block_d))
    u8 = torch.uint8
    sc = scales if scales is not None else ape  # not read unless store == "key"
    _pool_kernel[(T,)](
        kv, kv.stride(0), score, score.stride(0), ape, ring_kv, ring_sc,
        ring.in_step.view(u8), ring.in_step.stride(0), ring.step_row, ring.step_row.stride(0),
        ring.ring_row, ring.ring_row.stride(0), ring.valid.view(u8), ring.valid.stride(0),
        blk.phase, blk.block, blk.emit_slot, weight, cis, cis.stride(0), out, out.stride(0), out.stride(1),
        sc, sc.stride(0), sc.stride(1),
        out.shape[0] - 1, eps,
        RATIO=ratio, R=R, C=C, D=D, DR=dr, OVERLAP=C == 2 * D, BLOCK_R=block_r, BLOCK_D=block_d,
        STORE={"plain": 0, "row": 1, "key": 2}[store], NB=out.shape[-1], PDL=pdl,
        num_warps=8 if block_r * block_d >= TILE else 4, launch_pdl=pdl)
    _state_kernel[(T,)](kv, kv.stride(0), score, score.stride(0), ape, blk.phase, ring.write_row, ring_kv, ring_sc,
                        C=C, BLOCK_C=triton.next_power_of_2(C), PDL=pdl, num_warps=4, launch_pdl=pdl)
