"""Norm and rotary of a layer's query and key heads in one launch (Triton): q, the window kv row, the indexer query.

For each token t, with cis[t] [Dr/2] turning pair (x[2i], x[2i+1]) of the last Dr dims (GPT-J pairs):

    q[t, h]     <- rotary(rms_norm(q[t, h], None, eps))   every local head h of D dims, in place
    kv_out[t]   <- rotary(kv[t])                           the layer's one kv row, into the cache's dtype
                                                           (uint8 kv_out: quantized into the FP8 row layout)
    ring[write_row[t]] <- kv_out[t]                        optional: the window ring's store of that row, for
                                                           steps of one token per sequence (see `prepare_heads`)
    idx_q[t, h] <- rotary(idx_q[t, h])                     the indexer's Ih heads of Id dims, in place (r = 4)

This is `torch_path.heads`, `apply_rotary(rms_norm(q, None, eps), cis)`,
`apply_rotary(kv, cis).to(cache dtype)` and `apply_rotary(idx_q, cis)`, with the same rounding points:
the norm in fp32 rounded to q's dtype, the rotation in fp32 from that rounded value, one cast to the
input's dtype (then, for kv, to the cache's dtype). Pairs outside the last Dr dims pass unchanged.

Grid (T, programs per token): blocks of q heads, then the kv row, then blocks of indexer heads; each
program holds one [heads, D] tile in registers. Sizes are constexprs of the layer and T: capturable in
a CUDA graph, no host reads, a fixed configuration (no autotuning).

PDL (ops/kernel_support.py): every program waits before its first load (q, kv and the indexer query are
the projections' outputs, cis the step's angles) and triggers after its tile's last load (the angles, in
the rotation), before its store.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.cache_fp8 import row_bytes, store_row
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton

TILE = 2048  # elements of one program's tile: 4 heads of 512 dims, 16 indexer heads of 128


@jit
def rotate_pairs(x, cis_row, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr, DR: tl.constexpr,
                 INVERSE: tl.constexpr):
    """x [BLOCK_H, BLOCK_D] fp32 -> pairs (2i, 2i+1) of dims [D - DR, D) turned by cis[i] (by its conjugate
    when INVERSE), the rest as is. cis_row: pointer to this token's [DR/2, 2] (cos, sin) fp32. The one
    rotary of the Triton kernels (query preparation, the compressors' entries, attention's inverse)."""
    ev, od = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_D // 2, 2)))  # [BLOCK_H, BLOCK_D/2] each
    pair = tl.arange(0, BLOCK_D // 2)
    k = pair - (D - DR) // 2
    rope = (k >= 0) & (pair < D // 2)
    k = tl.where(rope, k, 0)
    c = tl.load(cis_row + 2 * k, mask=rope, other=1.0)[None, :]
    s = tl.load(cis_row + 2 * k + 1, mask=rope, other=0.0)[None, :]
    if INVERSE:
        s = -s
    # (a + ib)(c + is) = (ac - bs) + i(as + bc); pairs outside the rotary dims keep their exact values
    re = tl.where(rope[None, :], ev * c - od * s, ev)
    im = tl.where(rope[None, :], ev * s + od * c, od)
    return tl.reshape(tl.join(re, im), (BLOCK_H, BLOCK_D))


@jit
def _heads(in_ptr, s_in, out_ptr, s_out, h0, n_heads, cis_row, eps, NORM: tl.constexpr,
           BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr, DR: tl.constexpr, PDL: tl.constexpr):
    """Heads h0 .. h0 + BLOCK_H - 1 (< n_heads) of one token: rows of D at in_ptr + h * s_in, written
    at out_ptr + h * s_out rounded to the input's dtype, then to the output's (PDL: triggered before)."""
    h = h0 + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    m = (h < n_heads)[:, None] & (d < D)[None, :]
    x = tl.load(in_ptr + h[:, None] * s_in + d[None, :], mask=m, other=0.0)  # [BLOCK_H, BLOCK_D]
    xf = x.to(tl.float32)
    if NORM:  # per-head RMSNorm without weight, rounded to x's dtype as rms_norm returns it
        xf = (xf * tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]).to(x.dtype).to(tl.float32)
    y = rotate_pairs(xf, cis_row, BLOCK_H, BLOCK_D, D, DR, False)
    pdl_trigger(PDL)
    tl.store(out_ptr + h[:, None] * s_out + d[None, :], y.to(x.dtype).to(out_ptr.dtype.element_ty), mask=m)


@jit
def _kv_row(in_ptr, out_ptr, ring_ptr, cis_row, BLOCK_D: tl.constexpr, D: tl.constexpr, DR: tl.constexpr,
            FP8: tl.constexpr, NB: tl.constexpr, RING: tl.constexpr, PDL: tl.constexpr):
    """The kv row of one token: roped, rounded to its dtype, stored at out_ptr in the output's dtype (FP8:
    quantized into NB bytes of FP8 row) and, with RING, the same bytes at ring_ptr (PDL: triggered before
    the stores)."""
    d = tl.arange(0, BLOCK_D)
    x = tl.load(in_ptr + d[None, :], mask=(d < D)[None, :], other=0.0)  # [1, BLOCK_D]
    y = rotate_pairs(x.to(tl.float32), cis_row, 1, BLOCK_D, D, DR, False).to(x.dtype)
    pdl_trigger(PDL)
    y = tl.reshape(y, (BLOCK_D,))
    if FP8:
        store_row(out_ptr, y.to(tl.float32), D - DR, DR, BLOCK_D, NB)
        if RING:
            store_row(ring_ptr, y.to(tl.float32), D - DR, DR, BLOCK_D, NB)
    else:
        tl.store(out_ptr + d, y.to(out_ptr.dtype.element_ty), mask=d < D)
        if RING:
            tl.store(ring_ptr + d, y.to(ring_ptr.dtype.element_ty), mask=d < D)


@jit
def _prepare_heads_kernel(
    q_ptr, sq_t, sq_h,  # q [T, HQ, D], last dim contiguous: normed and roped in place
    kv_ptr, skv_t, kvo_ptr, skvo_t,  # kv [T, D] -> kv_out [T, D] (the window cache's dtype) or [T, NB] uint8
    iq_ptr, siq_t, siq_h,  # indexer query [T, IH, ID]: roped in place (HAS_IDX)
    cis_ptr, s_cis,  # [T, DR/2, 2] fp32
    ring_ptr, s_ring, wrow_ptr,  # window ring [slots * W, D] (FP8: [.., NB]) and write_row [T] long (RING)
    eps,
    HQ: tl.constexpr, D: tl.constexpr, IH: tl.constexpr, ID: tl.constexpr, DR: tl.constexpr,
    NQ: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr,
    BLOCK_ID: tl.constexpr, HAS_IDX: tl.constexpr, FP8: tl.constexpr, NB: tl.constexpr, RING: tl.constexpr,
    PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)  # [0, NQ): q head blocks; NQ: the kv row; past NQ: indexer head blocks
    cis_row = cis_ptr + t * s_cis
    pdl_wait(PDL)
    if p < NQ:
        q_row = q_ptr + t * sq_t
        _heads(q_row, sq_h, q_row, sq_h, p * BLOCK_H, HQ, cis_row, eps, True, BLOCK_H, BLOCK_D, D, DR, PDL)
    elif p == NQ:
        ring_row = ring_ptr
        if RING:  # the step index's write row (written earlier in the step: after the wait)
            ring_row = ring_ptr + tl.load(wrow_ptr + t) * s_ring
        _kv_row(kv_ptr + t * skv_t, kvo_ptr + t * skvo_t, ring_row, cis_row, BLOCK_D, D, DR, FP8, NB, RING, PDL)
    elif HAS_IDX:
        iq_row = iq_ptr + t * siq_t
        _heads(iq_row, siq_h, iq_row, siq_h, (p - NQ - 1) * BLOCK_I, IH, cis_row, eps, False, BLOCK_I, BLOCK_ID,
               ID, DR, PDL)


def _block_heads(n_heads: int, block_d: int) -> int:
    """Heads per program: a TILE-element tile, no more heads than the layer has (powers of two)."""
    return max(1, min(TILE // block_d, triton.next_power_of_2(n_heads)))


def prepare_heads(q: torch.Tensor, kv: torch.Tensor, kv_out: torch.Tensor, cis: torch.Tensor, eps: float,
                  idx_q: torch.Tensor | None = None, ring: tuple[torch.Tensor, torch.Tensor] | None = None,
                  pdl: bool = False) -> None:
    """One launch: q [T, Hl, D] per-head normed (no weight) and roped in place; kv [T, D] roped into
    kv_out [T, D] (its own dtype, e.g. the window cache's; uint8 [T, row bytes]: FP8 rows); idx_q [T, Ih, Id]
    or None roped in place. ring = (window [slots, W, width] of kv_out's dtype, write_row [T]) also stores
    kv_out's rows into the ring, row by row as `torch_path.write_ring` does: only where no token of the step
    reads a ring row another token writes (one token per sequence, padding in the trash slot).
    Every rotation turns the last Dr dims by cis [T, Dr/2] complex64. Last dims contiguous; q and
    idx_q are the caller's own buffers (the projections' outputs), since they are overwritten.
    pdl: launch with programmatic dependent launch (resolve_pdl; bitwise the same outputs)."""
    T, HQ, D = q.shape
    if T == 0:
        return
    dr = 2 * cis.shape[-1]
    cis_r = torch.view_as_real(cis)  # [T, Dr/2, 2] fp32
    fp8 = kv_out.dtype == torch.uint8
    assert q.stride(2) == 1 and kv.stride(1) == 1 and kv_out.stride(1) == 1 and kv.shape == (T, D)
    assert kv_out.shape == ((T, row_bytes(D, dr)) if fp8 else (T, D))
    assert cis_r.stride(1) == 2 and cis_r.stride(2) == 1 and len(cis) == T
    has_idx = idx_q is not None
    iq = idx_q if has_idx else q
    assert iq.shape[0] == T and iq.stride(2) == 1 and dr <= min(D, iq.shape[2])
    IH, ID = iq.shape[1:]
    block_d, block_id = triton.next_power_of_2(D), triton.next_power_of_2(ID)
    block_h, block_i = _block_heads(HQ, block_d), _block_heads(IH, block_id)
    nq = triton.cdiv(HQ, block_h)
    if ring is not None:
        window, write_row = ring
        assert window.dtype == kv_out.dtype and window.is_contiguous() and window.shape[-1] == kv_out.shape[1]
        ring_rows, wrow = window.view(-1, window.shape[-1]), write_row
    else:
        ring_rows, wrow = kv_out, cis_r  # unused
    grid = (T, nq + 1 + (triton.cdiv(IH, block_i) if has_idx else 0))
    _prepare_heads_kernel[grid](
        q, q.stride(0), q.stride(1), kv, kv.stride(0), kv_out, kv_out.stride(0), iq, iq.stride(0), iq.stride(1),
        cis_r, cis_r.stride(0), ring_rows, ring_rows.stride(0), wrow, eps,
        HQ=HQ, D=D, IH=IH, ID=ID, DR=dr, NQ=nq, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_I=block_i,
        BLOCK_ID=block_id, HAS_IDX=has_idx, FP8=fp8, NB=kv_out.shape[1], RING=ring is not None, PDL=pdl,
        num_warps=4, launch_pdl=pdl)
