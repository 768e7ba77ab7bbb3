"""Gluon: the decode / prefill sparse attention over FP8 cache rows, warp-specialized (the "wgmma_ws" kernel of
`AttnConfig`; same arguments and semantics as ops/sparse_attention_wgmma.py's kernel, torch twin
`torch_path.sparse_attention_sink`).

One program a token, its heads (up to 64, zero-padded to the MMA's 64 rows), three warpgroups that hand tiles
of BLOCK_N = 64 candidates to each other through shared memory and mbarriers:

    loader   (worker, 4 warps)  gathers a tile's FP8 rows (ops/cache_fp8.py's 592-byte layout) into registers,
                                decodes them (codes times their block's power-of-two scale, exact; the rope
                                dims as stored) and stores the bf16 tile into one of two ring slots
    softmax  (default, 4 warps) S [64, BLOCK_N] = Q K^T; online softmax in base 2 with the sink as the initial
                                running max; P and the rescale alpha into shared memory;
                                O[:, :256] = alpha O[:, :256] + P K[:, :256]
    values   (worker, 4 warps)  O[:, 256:] = alpha O[:, 256:] + P K[:, 256:]

Why: in the one-role kernel (ops/sparse_attention_wgmma.py) every warp waits for a tile's copies, decodes it,
then runs both products, so the decode and the gathers' latency sit in series with the MMAs (its FP8 rows
took 56 us where the same kernel without the decode took 47, H200, batch 128, ratio 4). Here the loader
decodes tile i + 1 while the other two warpgroups run tile i's products.

The loader streams chunks of CHUNK rows as 32-bit words in registers, AHEAD chunks' loads in flight while it
decodes one (a tile's row addresses are formed a tile ahead into shared memory, from index entries loaded a
tile before that; the entries are int64 tensors read as their low 32-bit words, so that the loader, at its
register budget, spills nothing: a spilled entry made each iteration wait for its load). Measured (H200,
results/h200-2026-12-04-attention-index-words): 51.2-51.8 us at batch 128, ratio 4, 64 heads (53.7 with spills;
the one-role kernel 55.6); 93.3-94.4 at batch 256. The loader still bounds it: per tile it takes about 3.5 us
(clock64 timeline), the MMA warpgroups wait for it half the loop, and the first tile is ready about 9.5 us
after the program starts. On the spilling loader, leaving the decode out saved 2 us at batch 128 and leaving
the hand-over fence out 0.4 us (timing only: both wrong). Bulk L2 prefetches of the rows one to three tiles
ahead, loads that bypass L1, and q loaded after the first row loads gained at most 0.4 us or slowed it;
per-line L2 prefetches two tiles ahead gained 0.5 us at batch 128 and 2.6 at 256 and lost 1.2 at ratio 128
(measured with the spilling loader). With up to 16 heads the one-role kernel keeps the heads on the MMA's N
and stays faster (43.4 against 51.2 us at 8).

mbarriers (each arrival is one thread's, after a barrier of its warpgroup):
    ready[s]  loader -> softmax: slot s holds a decoded tile (and its valid flags)
    free[s]   softmax and values -> loader (2 arrivals): both products of the tile in slot s are done
    p_ready   softmax -> values: P and alpha of the current tile are stored
    p_free    values -> softmax: the values warpgroup has read P and alpha
    den_ready softmax -> values, once: the softmax denominators are stored (each warpgroup stores its half)

A candidate that is not valid (padding, -1 picks, positions before 0, past the token's count) reads the token's
own step row instead, whose values are finite, and its score is -inf: its weight is exactly 0.

The output as the one-role kernel's: o / den rounded to the run dtype and stored, then the last DR dims (in
the values warpgroup's half) read back, rotated by the conjugate angles in fp32 and rounded again.

PDL: the program waits before it forks into the three roles (before any load); the softmax warpgroup
triggers once the last tile has landed (the loader's loads are done), before the stores.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.cache_fp8 import row_bytes
from tp_runtime.ops.kernel_support import gjit, gl, gl_const, gl_pdl_trigger, gl_pdl_wait
from tp_runtime.ops.sparse_attention_wgmma import _load_index, _row_ptrs, kernel_args, rotate_back

try:
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma
except ImportError:
    pass


HEADS = gl_const(64)  # the MMA's M: the softmax warpgroup's rows (a token's heads, zero-padded)
BLOCK_N = gl_const(64)  # candidates a tile
SLOTS = gl_const(2)  # decoded tiles in the ring: 2 x 64 KB beside q (64 KB) and P (8 KB)
HALF = gl_const(256)  # value dims a warpgroup accumulates
CHUNK = gl_const(16)  # rows the loader decodes and stores at a time (one a thread-row of its 4 warps)
CHUNKS = gl_const(4)  # chunks a tile
AHEAD = gl_const(3)  # chunks whose loads are in flight while the loader decodes one
NOPE, ROPE = gl_const(448), gl_const(64)  # the FP8 row layout at Flash dims (ops/cache_fp8.py)
ROW_BYTES = row_bytes(448 + 64, 64)  # 592: the rows the kernel is laid out for (host check)
LOADER_REGS = gl_const(152)  # the loader: AHEAD + 1 chunks of words (27 registers each), their decode, addresses
VALUES_REGS = gl_const(160)  # the values warpgroup: its half of O (128 fp32 a thread) and the MMA's addresses


def sparse_attention_ws(q: torch.Tensor, kv: torch.Tensor, win: torch.Tensor, ring, comp: torch.Tensor,
                        slot: torch.Tensor, picks: torch.Tensor, n_done: torch.Tensor, has_comp: bool,
                        has_picks: bool, n_comp: int, window: int, sink: torch.Tensor, qk_scale: float,
                        cis_r: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
    """One launch over T tokens of FP8 rows (uint8 [.., 592]); arguments as `sparse_attention_wgmma` takes them
    (win [slots * W, 592]; comp [slots, N, 592] or the ring; picks [T, C] or [T, 1]; qk_scale in log2 units;
    cis_r [T, DR/2, 2] fp32), q [T, H <= 64, 512] bf16 or fp16."""
    T, H, D = q.shape
    u8 = torch.uint8
    assert kv.dtype == u8 and kv.shape[-1] == ROW_BYTES and D == NOPE + ROPE and H <= HEADS
    assert all(s % 16 == 0 for s in (kv.stride(0), win.stride(0), comp.stride(0), comp.stride(1))), "row strides"
    _ws_kernel[(T,)](
        *kernel_args(q, kv, win, ring, comp, slot, picks, n_done, sink, cis_r, out, n_comp, qk_scale),
        W=window, D=D, DR=2 * cis_r.shape[1], HAS_COMP=has_comp, HAS_PICKS=has_picks, PDL=pdl,
        num_warps=4, launch_pdl=pdl)


@gjit
def _ws_kernel(
    q_ptr, sq_t, sq_h, kv_ptr, skv_t, win_ptr, swin,
    in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,
    comp_ptr, sc_slot, sc_row, slot_ptr, picks_ptr, s_pk, n_done_ptr, sink_ptr, cis_ptr, s_cis,
    out_ptr, s_out, H, C, qk_scale,
    W: gl.constexpr, D: gl.constexpr, DR: gl.constexpr, HAS_COMP: gl.constexpr, HAS_PICKS: gl.constexpr,
    PDL: gl.constexpr, num_warps: gl.constexpr,
):
    dt: gl.constexpr = q_ptr.dtype.element_ty
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dt)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEADS, D], dt)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEADS, BLOCK_N], dt)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_smem = gl.allocate_shared_memory(dt, [HEADS, D], q_sl)
    k_bufs = gl.allocate_shared_memory(dt, [SLOTS, BLOCK_N, D], k_sl)
    ok_bufs = gl.allocate_shared_memory(gl.int8, [SLOTS, BLOCK_N], flat)
    p_smem = gl.allocate_shared_memory(dt, [HEADS, BLOCK_N], p_sl)
    alpha_smem = gl.allocate_shared_memory(gl.float32, [HEADS], flat)  # also the denominators at the end
    rows_smem = gl.allocate_shared_memory(gl.int64, [2, BLOCK_N], flat)  # the loader's row addresses, 2 tiles
    bars = gl.allocate_shared_memory(gl.int64, [2 * SLOTS + 3, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS):
        mbarrier.init(bars.index(s), count=1)  # ready[s]
        mbarrier.init(bars.index(SLOTS + s), count=2)  # free[s]
    for b in gl.static_range(3):
        mbarrier.init(bars.index(2 * SLOTS + b), count=1)  # p_ready, p_free, den_ready

    t = gl.program_id(0)
    gl_pdl_wait(PDL)  # before any load: the step's rows, indices and counts are earlier kernels' outputs
    total = W
    if HAS_COMP:
        total += gl.minimum(gl.load(n_done_ptr + t), C).to(gl.int32)  # candidates this token reads (device count)
    n_tiles = gl.cdiv(total, BLOCK_N)
    gl.warp_specialize([
        (_softmax_role, (q_ptr, sq_t, sq_h, sink_ptr, cis_ptr, s_cis, out_ptr, s_out, t, H, qk_scale, n_tiles,
                         q_smem, k_bufs, ok_bufs, p_smem, alpha_smem, bars, D, DR, PDL)),
        (_values_role, (cis_ptr, s_cis, out_ptr, s_out, t, H, n_tiles, k_bufs, p_smem, alpha_smem, bars, D, DR)),
        (_loader_role, (kv_ptr, skv_t, win_ptr, swin, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr,
                        valid_ptr, s_va, comp_ptr, sc_slot, sc_row, slot_ptr, picks_ptr, s_pk, t, total, n_tiles,
                        k_bufs, ok_bufs, rows_smem, bars, W, HAS_COMP, HAS_PICKS)),
    ], [4, 4], [VALUES_REGS, LOADER_REGS])
    for b in gl.static_range(2 * SLOTS + 3):
        mbarrier.invalidate(bars.index(b))


@gjit
def _softmax_role(q_ptr, sq_t, sq_h, sink_ptr, cis_ptr, s_cis, out_ptr, s_out, t, H, qk_scale, n_tiles,
                  q_smem, k_bufs, ok_bufs, p_smem, alpha_smem, bars, D: gl.constexpr, DR: gl.constexpr,
                  PDL: gl.constexpr):
    # The default warpgroup: q into shared memory, then per tile the scores, the online softmax, P and alpha
    # handed to the values warpgroup, and the first half of O; at the end the denominators and its half's store.
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    heads = gl.arange(0, HEADS, layout=gl.SliceLayout(1, q_l))
    dims = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
    q = gl.load(q_ptr + t * sq_t + heads[:, None] * sq_h + dims[None, :], mask=(heads < H)[:, None], other=0.0)
    q_smem.store(q)
    fence_async_shared()
    gl.thread_barrier()  # the whole of q stored before the first MMA reads it

    h_l: gl.constexpr = gl.SliceLayout(1, s_l)
    hs = gl.arange(0, HEADS, layout=h_l)
    m = gl.load(sink_ptr + hs, mask=hs < H, other=0.0).to(gl.float32) * 1.4426950408889634  # log2 units
    den = gl.full([HEADS], 1.0, gl.float32, h_l)
    s_zero = gl.zeros([HEADS, BLOCK_N], gl.float32, s_l)
    o = gl.zeros([HEADS, HALF], gl.float32, o_l)
    for i in range(n_tiles):
        s = i % SLOTS
        mbarrier.wait(bars.index(s), (i // SLOTS) & 1)  # ready[s]: tile i decoded
        k_tile = k_bufs.index(s)
        sc = warpgroup_mma(q_smem, k_tile.permute((1, 0)), s_zero, use_acc=False)
        valid = ok_bufs.index(s).load(gl.SliceLayout(0, s_l)) != 0
        sc = gl.where(valid[None, :], sc * qk_scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(sc, axis=1))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(sc - m_new[:, None])
        den = den * alpha + gl.sum(p, axis=1)
        m = m_new
        mbarrier.wait(bars.index(2 * SLOTS + 1), (i + 1) & 1, pred=i > 0)  # p_free: tile i - 1's P read
        p_smem.store(p.to(p_smem.dtype))
        alpha_smem.store(alpha)
        fence_async_shared()
        gl.thread_barrier()  # P and alpha whole before the values warpgroup is told
        mbarrier.arrive(bars.index(2 * SLOTS))  # p_ready
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        o = warpgroup_mma(p_smem, k_tile.slice(0, HALF, 1), o)
        gl.thread_barrier()  # every thread past the products before the slot is handed back
        mbarrier.arrive(bars.index(SLOTS + s))  # free[s]
    gl_pdl_trigger(PDL)
    mbarrier.wait(bars.index(2 * SLOTS + 1), (n_tiles + 1) & 1)  # p_free: the last tile's alpha read
    alpha_smem.store(den)
    gl.thread_barrier()
    mbarrier.arrive(bars.index(2 * SLOTS + 2))  # den_ready
    _store_half(o, gl.convert_layout(den, gl.SliceLayout(1, o_l)), 0, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR,
                False)


@gjit
def _values_role(cis_ptr, s_cis, out_ptr, s_out, t, H, n_tiles, k_bufs, p_smem, alpha_smem, bars,
                 D: gl.constexpr, DR: gl.constexpr):
    # The values warpgroup: per tile, wait for P and alpha, rescale and accumulate the second half of O.
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    a_l: gl.constexpr = gl.SliceLayout(1, o_l)
    o = gl.zeros([HEADS, HALF], gl.float32, o_l)
    for i in range(n_tiles):
        s = i % SLOTS
        mbarrier.wait(bars.index(2 * SLOTS), i & 1)  # p_ready (tile i landed before the softmax told us)
        alpha = alpha_smem.load(a_l)
        o = o * alpha[:, None]
        o = warpgroup_mma(p_smem, k_bufs.index(s).slice(HALF, HALF, 1), o)
        gl.thread_barrier()  # every thread has read alpha, and the product is done
        mbarrier.arrive(bars.index(2 * SLOTS + 1))  # p_free
        mbarrier.arrive(bars.index(SLOTS + s))  # free[s]
    mbarrier.wait(bars.index(2 * SLOTS + 2), 0)  # den_ready
    den = alpha_smem.load(a_l)
    _store_half(o, den, HALF, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR, True)


@gjit
def _loader_role(kv_ptr, skv_t, win_ptr, swin, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr,
                 valid_ptr, s_va, comp_ptr, sc_slot, sc_row, slot_ptr, picks_ptr, s_pk, t, total, n_tiles,
                 k_bufs, ok_bufs, rows_smem, bars, W: gl.constexpr, HAS_COMP: gl.constexpr, HAS_PICKS: gl.constexpr):
    # The loader streams chunks of CHUNK rows, AHEAD chunks' loads in flight while it decodes and stores one.
    # A tile's row addresses are formed an iteration before its first chunk's loads go out, from index entries
    # loaded an iteration before that, and kept in rows_smem (one slot a tile, addresses with bit 0 set where
    # the candidate is not valid): no chunk waits on an index load.
    # [CHUNK, 8, 16] words of a row's blocks: a thread holds 4 (16 bytes) of a block, a warp 4 rows x 2 blocks;
    # decoded, [CHUNK, 8, 32] words (bf16 pairs), 8 a thread
    blk: gl.constexpr = gl.BlockedLayout([1, 1, 4], [4, 2, 4], [4, 1, 1], [2, 1, 0])
    out_l: gl.constexpr = gl.BlockedLayout([1, 1, 8], [4, 2, 4], [4, 1, 1], [2, 1, 0])
    tile_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # [BLOCK_N] index entries of a tile
    w_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    comp_base = comp_ptr + gl.multiple_of(gl.load(slot_ptr + t) * sc_slot, 16)
    e = _load_index(t, 0, total, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,
                    picks_ptr, s_pk, W, HAS_PICKS, BLOCK_N, tile_l)
    _store_rows(t, 0, total, e, kv_ptr, skv_t, win_ptr, swin, comp_base, sc_row, rows_smem.index(0), W, HAS_COMP,
                tile_l)
    e = _load_index(t, BLOCK_N, total, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,
                    picks_ptr, s_pk, W, HAS_PICKS, BLOCK_N, tile_l)
    gl.thread_barrier()  # tile 0's addresses stored
    cur = ()
    for c in gl.static_range(AHEAD):  # tile 0's first chunks
        cur = cur + (_load_chunk(rows_smem.index(0).slice(c * CHUNK, CHUNK), True, blk, out_l), )
    for j in range(n_tiles):
        s = j % SLOTS
        more = j + 1 < n_tiles
        # tile j + 1's addresses (its entries loaded an iteration ago), then tile j + 2's entries
        _store_rows(t, (j + 1) * BLOCK_N, total, e, kv_ptr, skv_t, win_ptr, swin, comp_base, sc_row,
                    rows_smem.index((j + 1) % 2), W, HAS_COMP, tile_l)
        e = _load_index(t, (j + 2) * BLOCK_N, total, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr,
                        valid_ptr, s_va, picks_ptr, s_pk, W, HAS_PICKS, BLOCK_N, tile_l)
        gl.thread_barrier()  # tile j + 1's addresses stored before any thread reads them
        tile = cur  # tile j's chunks, in order (the first AHEAD loaded before this iteration)
        nxt = ()
        for c in gl.static_range(CHUNKS):
            if c + AHEAD < CHUNKS:
                rows = rows_smem.index(j % 2).slice((c + AHEAD) * CHUNK, CHUNK)
                tile = tile + (_load_chunk(rows, True, blk, out_l), )
            else:
                rows = rows_smem.index((j + 1) % 2).slice((c + AHEAD - CHUNKS) * CHUNK, CHUNK)
                nxt = nxt + (_load_chunk(rows, more, blk, out_l), )
            if c == 0:
                mbarrier.wait(bars.index(SLOTS + s), ((j // SLOTS) & 1) ^ 1, pred=j >= SLOTS)  # free[s]
            words = k_bufs.index(s)._reinterpret(gl.int32, [BLOCK_N, 256], w_sl)  # the same bytes
            _decode_store(tile[c], words.slice(c * CHUNK, CHUNK, 0), ok_bufs.index(s).slice(c * CHUNK, CHUNK, 0),
                          blk, out_l)
        fence_async_shared()
        gl.thread_barrier()  # the whole tile stored before the softmax warpgroup is told
        mbarrier.arrive(bars.index(s))  # ready[s]
        cur = nxt


@gjit
def _store_rows(t, j0, total, e, kv_ptr, skv_t, win_ptr, swin, comp_base, sc_row, dst, W: gl.constexpr,
                HAS_COMP: gl.constexpr, layout: gl.constexpr):
    # Candidates j0 .. j0 + BLOCK_N - 1's row addresses -> dst [BLOCK_N] int64, bit 0 set where not valid
    ptr, ok = _row_ptrs(t, j0, total, e[0], e[1], e[2], e[3], e[4], kv_ptr, skv_t, win_ptr, swin, comp_base,
                        sc_row, W, HAS_COMP, BLOCK_N, layout)
    dst.store(ptr.to(gl.int64) | (~ok).to(gl.int64))


# e4m3 codes -> bf16, two pairs a 32-bit word ($2: four codes; $3: the block's scale 2^(v - 127) as bf16x2):
# each code's byte moved into a bf16 lane as (sign << 15) | ((byte & 0x7F) << 4), which is the code's value times
# 2^-120 (its subnormals too), then times 2^120 and times the scale (exact: every product is a power of two
# times a value of <= 4 significant bits). $0: codes 0, 1; $1: codes 2, 3.


def _decode_pair(select: str, out: int) -> str:
    # two codes of $2 (the bytes prmt `select` picks) -> $out, as the comment above says
    return f"""prmt.b32 a, $2, 0, {select};
and.b32 s, a, 0x00800080;
and.b32 m, a, 0x007F007F;
shl.b32 s, s, 8;
shl.b32 m, m, 4;
or.b32 a, s, m;
mul.rn.bf16x2 a, a, k;
mul.rn.bf16x2 ${out}, a, $3;
"""


_DECODE_ASM = gl_const("{\n.reg .b32 a, s, m, k;\nmov.b32 k, 0x7B807B80;\n" + _decode_pair("0x4140", 0)
                        + _decode_pair("0x4342", 1) + "}")


@gjit
def _load_chunk(rows, live, blk: gl.constexpr, out_l: gl.constexpr):
    # The bytes of CHUNK rows (rows [CHUNK]: their 16-byte aligned addresses, bit 0 = not valid) into registers
    # as 32-bit words, nothing where not live: codes [CHUNK, 8, 16] (a thread: 16 bytes of a 64-dim block, one
    # load; block 7 left out), the rope dims' bf16 pairs [CHUNK, 32], the scale bytes as one u64 a row
    # -> (codes, rope, scales, ok)
    v = rows.load(gl.SliceLayout(1, gl.SliceLayout(2, blk)))
    ok = (v & 1) == 0
    ptr = gl.multiple_of((v & -16).to(gl.pointer_type(gl.uint8)), 16)
    b = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, blk)))
    w = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, blk)))
    p32 = gl.multiple_of(ptr.to(gl.pointer_type(gl.int32)), 16)
    codes = gl.load(p32[:, None, None] + ((b % 7) * 16)[None, :, None] + w[None, None, :],
                    mask=(b < 7)[None, :, None] & live)
    rope_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])  # [CHUNK, 32]: 16 bytes a thread
    rp = gl.convert_layout(gl.multiple_of((ptr + NOPE).to(gl.pointer_type(gl.int32)), 16),
                           gl.SliceLayout(1, rope_l))
    rope = gl.load(rp[:, None] + gl.arange(0, 32, layout=gl.SliceLayout(0, rope_l))[None, :], mask=live)
    scales = gl.load((ptr + NOPE + 2 * ROPE).to(gl.pointer_type(gl.uint64)), mask=live)
    return codes, rope, scales, ok


@gjit
def _decode_store(raw, dst, ok_dst, blk: gl.constexpr, out_l: gl.constexpr):
    # A chunk's words -> its rows of the MMA tile, dst [CHUNK, 256] (the tile's bf16 pairs as 32-bit words):
    # the codes decoded (_DECODE_ASM), the rope words as stored over block 7; its valid flags -> ok_dst [CHUNK]
    codes, rope, scales, ok = raw
    b = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, blk)))
    v = ((scales[:, None] >> (8 * b[None, :]).to(gl.uint64)) & 0xFF).to(gl.int32)  # [CHUNK, 8] scale bytes
    s2 = (v << 7) | (v << 23)  # 2^(v - 127) twice, as bf16 bits
    lo, hi = gl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,r,r", [codes, s2[:, :, None] + gl.zeros_like(codes)],
                                       dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    words = gl.convert_layout(gl.reshape(gl.join(lo, hi), [dst.shape[0], 8, 32]), out_l)
    dst.store(gl.reshape(words, [dst.shape[0], 256]))
    dst.slice(224, 32, 1).store(rope)  # over block 7's words (the compiler orders the two stores)
    ok_dst.store(ok.to(gl.int8))


@gjit
def _store_half(o, den, COL0: gl.constexpr, t, cis_ptr, s_cis, out_ptr, s_out, H, D: gl.constexpr,
                DR: gl.constexpr, ROTARY: gl.constexpr):
    # o [HEADS, HALF] / den in the run dtype into dims COL0.. of each head's output row; with ROTARY, then the
    # inverse rotary of the row's last DR dims (GPT-J pairs; in this half) on the rounded values.
    dt: gl.constexpr = out_ptr.dtype.element_ty
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    ob = gl.convert_layout((o / den[:, None]).to(dt), out_l)
    heads = gl.arange(0, HEADS, layout=gl.SliceLayout(1, out_l))
    dims = gl.arange(0, HALF, layout=gl.SliceLayout(0, out_l))
    gl.store(out_ptr + t * s_out + heads[:, None] * D + COL0 + dims[None, :], ob, mask=(heads < H)[:, None])
    if ROTARY:
        pair_l: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [4, 1], [1, 0])
        i = gl.arange(0, DR // 2, layout=gl.SliceLayout(0, pair_l))
        c = gl.load(cis_ptr + t * s_cis + 2 * i)
        sn = gl.load(cis_ptr + t * s_cis + 2 * i + 1)
        gl.thread_barrier()  # the rounded rows are visible to the whole warpgroup
        rotate_back(out_ptr, t, s_out, c, sn, H, HEADS, D, DR, pair_l)
