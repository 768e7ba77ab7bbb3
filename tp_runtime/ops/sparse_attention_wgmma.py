"""Gluon (Triton's dialect with explicit layouts): the decode sparse attention of ops/sparse_attention.py for many
tokens on Hopper, gathered rows streamed through shared memory into warpgroup MMAs (the "wgmma" kernel of
`AttnConfig`; same arguments, same semantics, torch twin `torch_path.sparse_attention_sink`).

One program a token, every local head of it, bf16 (or fp16) rows of D = 512 dims. More than FEW_HEADS heads
(tp 1: 64) sit on the MMA's M, padded to its 64 rows with zero queries; per tile of BLOCK_N candidates:

    S [64, BLOCK_N] = Q [64, D] . K^T          (Q in shared memory, K the gathered tile)
    online softmax in base 2, the sink as the initial running max (denominator 1)
    O [64, D] += P [64, BLOCK_N] . K           (P through shared memory; V is the same rows)

Up to FEW_HEADS heads (a tp 4 or tp 8 shard's 16 or 8) sit on N instead, rounded up to 8 or 16 (HEADS_N), so
that a shard's MMAs do its heads' work, not 64 heads': one warpgroup, 64-row tiles (the tile's rows on M),

    S^T [64, Hb] = K . Q^T                      O^T [D, Hb] += K^T . P^T   (K^T: the tile read transposed)

and, with q and P small, a ring of 3 tiles where shared memory allows (`heads_n_stages`).

Why a second kernel: Triton lays a chained dot's first product out with every warp on the heads' dimension
(warpsPerCTA [8, 1]), so with 64 heads both warpgroups compute the whole score tile, and each dot is waited on
as soon as it is issued. Here both products split their N dimension between the two warpgroups ([4, 2]): each
scores half the tile's rows and accumulates half the value dims; the row maxima and P cross between them
through shared memory.

The gathers: tile i + STAGES - 1's rows are copied (cp.async, 16 bytes a thread a copy) into the stage tile i - 1
used while tile i's products run. Their addresses come from index entries (RingIndex rows, picks) loaded an
iteration earlier, all side by side, so no load waits on another in front of a gather and no warp stalls on
an index load in the middle of an iteration. A candidate that is not valid (padding, -1 picks, positions before
0, past the token's count) reads the token's own step row instead, whose values are finite, and its score is
-inf: its weight is exactly 0, as the Triton kernel's zero-filled loads give.

FP8 rows (ops/cache_fp8.py's 592-byte layout): a tile's bytes are copied as stored (16 bytes a copy: rows are
16-byte aligned) into staging buffers, then every thread decodes its share into one bf16 MMA tile (codes times
their block's power-of-two scale, exact; the rope dims as stored) between the copies' wait and the products.

The output: o / den rounded to the run dtype and stored, then its last DR dims read back, rotated by the
conjugate angles in fp32 and rounded again: exactly the torch twin's order (o in the run dtype, then
`apply_rotary(inverse=True)`).

PDL as the Triton kernel: wait before the first load, trigger after the last load of earlier kernels' data
(the last tile's rows), before the stores.

On installs without Triton (or without Gluon) this module still imports; its kernel cannot run.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.kernel_support import gjit, gl, gl_pdl_trigger, gl_pdl_wait, gluon_hopper

try:
    from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma
except ImportError:
    pass

HEADS = 64  # the MMA's M: a warpgroup's rows; a program of more than FEW_HEADS heads holds 64 (zero-padded)
# up to this many heads the products put the heads on N (rounded up to 8 or 16), not M. At 32 heads that layout
# measured slower with FP8 rows (H200, batch 128, ratio 4: 70.7 against 53.3 us; its one warpgroup spills while
# decoding), faster at 8 and 16 (results/h200-2026-12-03-select-runs)
FEW_HEADS = 16
HEADS_N_ROWS = 64  # tile rows with the heads on N: the MMA's M (one warpgroup)
DIMS, ROPE = 512, 64  # row dims the kernel is laid out for (DeepSeek-V4's head_dim and rotary dims)


def wgmma_attention_fits(device: torch.device, n_heads: int, head_dim: int, rope_dim: int, dtype: torch.dtype
                         ) -> bool:
    """The kernel can run on `device` (`gluon_hopper`) and covers this layer: q (and 16-bit rows) in bf16 or
    fp16, DIMS dims of which ROPE rotary (FP8 rows: 448 e4m3 codes in 7 scale blocks, then the rope dims), at
    most HEADS local heads."""
    return (gluon_hopper(device) and head_dim == DIMS and rope_dim == ROPE and n_heads <= HEADS
            and dtype in (torch.bfloat16, torch.float16))


def sparse_attention_wgmma(q: torch.Tensor, kv: torch.Tensor, win: torch.Tensor, ring, comp: torch.Tensor,
                           slot: torch.Tensor, picks: torch.Tensor, n_done: torch.Tensor, has_comp: bool,
                           has_picks: bool, n_comp: int, window: int, sink: torch.Tensor, qk_scale: float,
                           cis_r: torch.Tensor, out: torch.Tensor, block_n: int, stages: int, pdl: bool) -> None:
    """One launch over T tokens (no split). Arguments as ops/sparse_attention.py hands them to its Triton kernel:
    win [slots * W, D] the ring; comp [slots, N, D] (the ring where has_comp is False); picks [T, C] or [T, 1]
    (unused); n_done [T] (unused where not has_comp); qk_scale in log2 units; cis_r [T, DR/2, 2] fp32.
    block_n, stages: the tile ring of the 64-head layout; with up to FEW_HEADS heads the tiles are HEADS_N_ROWS
    rows, `heads_n_stages` deep."""
    T, H, D = q.shape
    u8 = torch.uint8
    fp8 = kv.dtype == u8
    # the gathers promise the compiler 16-byte aligned rows (16 elements: bf16 rows of 512 dims, FP8 rows of 592)
    assert all(s % 16 == 0 for s in (kv.stride(0), win.stride(0), comp.stride(0), comp.stride(1))), "row strides"
    heads_n = H <= FEW_HEADS
    if heads_n:
        block_h = max(8, 1 << (H - 1).bit_length())  # 8 or 16 (32 where FEW_HEADS allows)
        block_n, stages = HEADS_N_ROWS, heads_n_stages(block_h, fp8)
    else:
        block_h = HEADS
    _attn_kernel[(T,)](
        *kernel_args(q, kv, win, ring, comp, slot, picks, n_done, sink, cis_r, out, n_comp, qk_scale),
        W=window, D=D, DR=2 * cis_r.shape[1], HAS_COMP=has_comp, HAS_PICKS=has_picks, BLOCK_N=block_n,
        STAGES=stages, FP8=fp8, PDL=pdl, BLOCK_H=block_h, HEADS_N=heads_n, num_warps=4 if heads_n else 8,
        launch_pdl=pdl)


def kernel_args(q: torch.Tensor, kv: torch.Tensor, win: torch.Tensor, ring, comp: torch.Tensor, slot: torch.Tensor,
                picks: torch.Tensor, n_done: torch.Tensor, sink: torch.Tensor, cis_r: torch.Tensor, out: torch.Tensor,
                n_comp: int, qk_scale: float) -> tuple:
    """The positional arguments of this file's kernel and of ops/sparse_attention_ws_wgmma.py's, in their order:
    each tensor with its row strides (the RingIndex's flags as bytes), then H, C and the scale."""
    u8 = torch.uint8
    srow, rrow, pk = (low_words(x) for x in (ring.step_row, ring.ring_row, picks))
    return (q, q.stride(0), q.stride(1), kv, kv.stride(0), win, win.stride(0),
            ring.in_step.view(u8), ring.in_step.stride(0), srow, srow.stride(0), rrow, rrow.stride(0),
            ring.valid.view(u8), ring.valid.stride(0), comp, comp.stride(0), comp.stride(1), slot, pk, pk.stride(0),
            n_done, sink, cis_r, cis_r.stride(0), out, out.stride(0), q.shape[1], n_comp, qk_scale)


def low_words(x: torch.Tensor) -> torch.Tensor:
    """An int64 index tensor [T, n] (entries in [-1, 2^31)) as its low 32-bit words, the int32 view [T, 2n]:
    the kernels load entry j as word 2j, so an entry held for an iteration takes one register, not two."""
    assert x.dtype == torch.int64 and x.stride(-1) == 1, "index tensors are int64 with contiguous rows"
    return x.view(torch.int32)


def heads_n_stages(block_h: int, fp8: bool) -> int:
    """The deepest ring of HEADS_N_ROWS-row tiles beside block_h heads' q that fits Hopper's 227 KB of shared
    memory: bf16 tiles are 64 KB (3 up to 16 heads, 2 at 32); FP8 rows stage 41 KB a tile beside one 64 KB bf16
    tile (3 at every head count)."""
    if fp8:
        return 3
    return 3 if block_h <= 16 else 2


@gjit
def _load_index(t, j0, total, in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va, picks_ptr,
                s_pk, W: gl.constexpr, HAS_PICKS: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Candidates j0 .. j0 + BLOCK_N - 1 of token t: their index entries, all loaded at once (none waits on another;
    `_row_ptrs` uses them an iteration later) -> (in_step, step_row, ring_row, valid, pick) [BLOCK_N] in `layout`."""
    j = j0 + gl.arange(0, BLOCK_N, layout=layout)
    win = (j < total) & (j < W)
    ins = gl.load(in_step_ptr + t * s_in + j, mask=win, other=0)
    srow = gl.load(step_row_ptr + t * s_sr + 2 * j, mask=win, other=0)  # int64 entries' low words (`low_words`)
    rrow = gl.load(ring_row_ptr + t * s_rr + 2 * j, mask=win, other=0)
    val = gl.load(valid_ptr + t * s_va + j, mask=win, other=0)
    if HAS_PICKS:
        pick = gl.load(picks_ptr + t * s_pk + 2 * (j - W), mask=(j < total) & (j >= W), other=-1)
    else:  # ratio 128: compressed candidate c is entry c
        pick = j - W
    return ins, srow, rrow, val, pick


@gjit
def _row_ptrs(t, j0, total, ins, srow, rrow, val, pick, kv_ptr, skv_t, win_ptr, swin, comp_base, sc_row,
              W: gl.constexpr, HAS_COMP: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Candidates j0 .. j0 + BLOCK_N - 1 of token t, from their index entries (`_load_index`) -> (row pointers
    [BLOCK_N], valid [BLOCK_N]). Window candidates (j < W) come from this step's rows or the ring, compressed ones
    from the token's slot (picks: -1 = none); an invalid candidate points at the token's own step row."""
    j = j0 + gl.arange(0, BLOCK_N, layout=layout)
    live = j < total
    ok = live & (j < W) & (val != 0)
    ptr = gl.where(ins != 0, kv_ptr + gl.multiple_of(srow.to(gl.int64) * skv_t, 16),
                   win_ptr + gl.multiple_of(rrow.to(gl.int64) * swin, 16))
    if HAS_COMP:
        ptr = gl.where(j >= W, comp_base + gl.multiple_of(gl.maximum(pick, 0).to(gl.int64) * sc_row, 16), ptr)
        ok = ok | (live & (j >= W) & (pick >= 0))
    ptr = gl.where(ok, ptr, kv_ptr + gl.multiple_of(t * skv_t, 16))
    return ptr, ok


@gjit
def _issue(k_bufs, ok_bufs, j, n_tiles, ptr, ok, dims, STAGES: gl.constexpr):
    # Tile j's rows (if the token has it) into stage j % STAGES, its valid flags beside; one copy group a call.
    if j < n_tiles:
        async_copy.async_copy_global_to_shared(k_bufs.index(j % STAGES), ptr[:, None] + dims[None, :])
    ok_bufs.index(j % STAGES).store(ok.to(gl.int8))
    async_copy.commit_group()


@gjit
def _issue_fp8(st, ok_bufs, j, n_tiles, ptr, ok, STAGES: gl.constexpr, num_warps: gl.constexpr):
    # FP8 rows: tile j's bytes as stored (ops/cache_fp8.py: 448 e4m3 codes, 64 bf16 rope dims, 7 scale bytes and
    # padding to 592) into stage j % STAGES of the staging buffers st = (codes [N, 512] (columns 448.. zero-filled),
    # rope [N, 64] bf16 bits, scales and padding [N, 16]), 16 bytes a copy.
    s = j % STAGES
    if j < n_tiles:
        _copy(st[0].index(s), ptr, 0, 448, num_warps)
        _copy(st[1].index(s), (ptr + 448).to(gl.pointer_type(gl.uint16)), 0, 64, num_warps)
        _copy(st[2].index(s), ptr, 576, 16, num_warps)
    ok_bufs.index(s).store(ok.to(gl.int8))
    async_copy.commit_group()


@gjit
def _copy(dst, ptr, START: gl.constexpr, COLS: gl.constexpr, num_warps: gl.constexpr):
    # Elements START .. START + COLS - 1 of each row at ptr [N] into dst [N, WIDTH] (zeros past COLS): 16 bytes a
    # thread a copy (rows are 16-byte aligned). Rows spread over threads as the gathers' row layout spreads them,
    # so that ptr needs no layout conversion (a round trip through shared memory, with its barriers).
    WIDTH: gl.constexpr = dst.shape[1]
    VEC: gl.constexpr = 128 // dst.dtype.primitive_bitwidth
    lay: gl.constexpr = gl.BlockedLayout([1, VEC], [4, 8], [num_warps, 1], [1, 0])
    p = gl.convert_layout(ptr, gl.SliceLayout(1, lay)) + START
    cols = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, lay))
    if COLS < WIDTH:
        async_copy.async_copy_global_to_shared(dst, p[:, None] + cols[None, :], mask=(cols < COLS)[None, :])
    else:
        async_copy.async_copy_global_to_shared(dst, p[:, None] + cols[None, :])


@gjit
def _decode(st, s, k_tile, num_warps: gl.constexpr):
    # Stage s's FP8 rows -> k_tile [N, 512] in its dtype: codes times their block's scale 2^(v - 127) (exact), all
    # 512 columns in one store (the eighth block's codes are zeros), then the rope dims' bf16 bits as they are over
    # columns 448..: two stores, so two barriers (the compiler orders every store to one buffer by a barrier).
    dt: gl.constexpr = k_tile.dtype
    N: gl.constexpr = k_tile.shape[0]
    # [N, 8, 64]: a thread holds 16 codes of a block, a warp 4 rows x 2 blocks (128 bytes a row: no bank
    # conflict), and each block's scale sits in the registers of the threads that hold its codes
    blk: gl.constexpr = gl.BlockedLayout([1, 1, 16], [4, 2, 4], [num_warps, 1, 1], [2, 1, 0])
    lay: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])  # the same, as [N, 512]
    codes = st[0].index(s).reshape([N, 8, 64]).load(blk)
    v = st[2].index(s).slice(0, 8, 1).load(gl.SliceLayout(2, blk))  # [N, 8] scale bytes (the eighth: padding)
    scale = (v.to(gl.int32) << 23).to(gl.float32, bitcast=True)
    vals = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, :, None]
    k_tile.store(gl.convert_layout(gl.reshape(vals.to(dt), [N, 512]), lay))
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    bits = st[1].index(s).load(rope_l).to(gl.int32)
    k_tile.slice(448, 64, 1).store((bits << 16).to(gl.float32, bitcast=True).to(dt))


@gjit
def _attn_kernel(
    q_ptr, sq_t, sq_h, kv_ptr, skv_t, win_ptr, swin,
    in_step_ptr, s_in, step_row_ptr, s_sr, ring_row_ptr, s_rr, valid_ptr, s_va,
    comp_ptr, sc_slot, sc_row, slot_ptr, picks_ptr, s_pk, n_done_ptr, sink_ptr, cis_ptr, s_cis,
    out_ptr, s_out, H, C, qk_scale,
    W: gl.constexpr, D: gl.constexpr, DR: gl.constexpr, HAS_COMP: gl.constexpr, HAS_PICKS: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, FP8: gl.constexpr, PDL: gl.constexpr, BLOCK_H: gl.constexpr,
    HEADS_N: gl.constexpr, num_warps: gl.constexpr,
):
    dt: gl.constexpr = q_ptr.dtype.element_ty
    if HEADS_N:  # one warpgroup: S^T [BLOCK_N, BLOCK_H] (the tile's rows on M), O^T [D, BLOCK_H] (dims on M)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_H, 16])
        o_l: gl.constexpr = s_l
        p_shape: gl.constexpr = [BLOCK_N, BLOCK_H]
    else:  # both warpgroups on N (half the tile's rows / half the value dims each), all 64 heads on M
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, BLOCK_N // 2, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, D // 2, 16])
        p_shape: gl.constexpr = [BLOCK_H, BLOCK_N]
    # gathers: 16 bytes a thread a copy, a warp 4 rows x 128 bytes (conflict-free into the 128-byte swizzle)
    cp_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    row_l: gl.constexpr = gl.SliceLayout(1, cp_l)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dt)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D], dt)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for(p_shape, dt)

    t = gl.program_id(0)
    heads = gl.arange(0, BLOCK_H, layout=row_l)
    dims = gl.arange(0, D, layout=gl.SliceLayout(0, cp_l))
    gl_pdl_wait(PDL)
    q = gl.load(q_ptr + t * sq_t + heads[:, None] * sq_h + dims[None, :], mask=(heads < H)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(dt, [BLOCK_H, D], q_sl, q)
    if FP8:  # rows staged as stored, decoded into one tile a step
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        st = (gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 512], plain),
              gl.allocate_shared_memory(gl.uint16, [STAGES, BLOCK_N, 64], plain),
              gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 16], plain))
        k_bufs = gl.allocate_shared_memory(dt, [1, BLOCK_N, D], k_sl)
    else:
        k_bufs = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, D], k_sl)
        st = k_bufs  # no staging
    ok_bufs = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    p_smem = gl.allocate_shared_memory(dt, p_shape, p_sl)

    total = W
    if HAS_COMP:
        total += gl.minimum(gl.load(n_done_ptr + t), C).to(gl.int32)  # candidates this token reads (device count)
    n_tiles = gl.cdiv(total, BLOCK_N)
    comp_base = comp_ptr + gl.multiple_of(gl.load(slot_ptr + t) * sc_slot, 16)

    # tiles 0 .. STAGES - 2 in flight, the next one's index entries loaded
    for j in gl.static_range(STAGES - 1):
        ins, srow, rrow, val, pick = _load_index(t, j * BLOCK_N, total, in_step_ptr, s_in, step_row_ptr, s_sr,
                                                 ring_row_ptr, s_rr, valid_ptr, s_va, picks_ptr, s_pk, W, HAS_PICKS,
                                                 BLOCK_N, row_l)
        ptr0, ok0 = _row_ptrs(t, j * BLOCK_N, total, ins, srow, rrow, val, pick, kv_ptr, skv_t, win_ptr, swin,
                              comp_base, sc_row, W, HAS_COMP, BLOCK_N, row_l)
        if FP8:
            _issue_fp8(st, ok_bufs, j, n_tiles, ptr0, ok0, STAGES, num_warps)
        else:
            _issue(k_bufs, ok_bufs, j, n_tiles, ptr0, ok0, dims, STAGES)
    ins, srow, rrow, val, pick = _load_index(t, (STAGES - 1) * BLOCK_N, total, in_step_ptr, s_in, step_row_ptr, s_sr,
                                             ring_row_ptr, s_rr, valid_ptr, s_va, picks_ptr, s_pk, W, HAS_PICKS,
                                             BLOCK_N, row_l)

    h_l: gl.constexpr = gl.SliceLayout(0 if HEADS_N else 1, s_l)  # a head's running max and denominator
    hs = gl.arange(0, BLOCK_H, layout=h_l)
    m = gl.load(sink_ptr + hs, mask=hs < H, other=0.0).to(gl.float32) * 1.4426950408889634  # log2 units
    den = gl.full([BLOCK_H], 1.0, gl.float32, h_l)
    if HEADS_N:
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, s_l)
        o = gl.zeros([D, BLOCK_H], gl.float32, o_l)
    else:
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_l)
        o = gl.zeros([BLOCK_H, D], gl.float32, o_l)
    for i in range(n_tiles):
        # tile i + STAGES - 1 into the stage tile i - 1 used (every warp is done with it: `_online_softmax` ends in
        # a barrier), from index entries loaded an iteration ago; then tile i + STAGES's entries, for the next one
        j0 = (i + STAGES - 1) * BLOCK_N
        ptr, ok = _row_ptrs(t, j0, total, ins, srow, rrow, val, pick, kv_ptr, skv_t, win_ptr, swin, comp_base, sc_row,
                            W, HAS_COMP, BLOCK_N, row_l)
        if FP8:
            _issue_fp8(st, ok_bufs, i + STAGES - 1, n_tiles, ptr, ok, STAGES, num_warps)
        else:
            _issue(k_bufs, ok_bufs, i + STAGES - 1, n_tiles, ptr, ok, dims, STAGES)
        ins, srow, rrow, val, pick = _load_index(t, j0 + BLOCK_N, total, in_step_ptr, s_in, step_row_ptr, s_sr,
                                                 ring_row_ptr, s_rr, valid_ptr, s_va, picks_ptr, s_pk, W, HAS_PICKS,
                                                 BLOCK_N, row_l)
        k_tile = _landed(k_bufs, st, i % STAGES, STAGES, FP8, num_warps)
        valid = ok_bufs.index(i % STAGES).load(gl.SliceLayout(1 if HEADS_N else 0, s_l)) != 0
        if HEADS_N:
            m, den, o = _online_softmax_t(q_smem, k_tile, p_smem, valid, m, den, o, s_zero, qk_scale)
        else:
            m, den, o = _online_softmax(q_smem, k_tile, p_smem, valid, m, den, o, s_zero, qk_scale)
    async_copy.wait_group(0)
    if HEADS_N:
        o = gl.permute(o, (1, 0))  # [BLOCK_H, D]: the registers as they are
    _store(o, den, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR, PDL, num_warps)


@gjit
def _landed(k_bufs, st, s, STAGES: gl.constexpr, FP8: gl.constexpr, num_warps: gl.constexpr):
    # The MMA operand of the tile in stage s, once its copies have landed (FP8 rows: decoded into k_bufs[0]).
    async_copy.wait_group(STAGES - 1)  # this thread's copies of the tile have landed
    fence_async_shared()  # ... visible to the MMAs (and q's store, the first time)
    gl.thread_barrier()  # ... and every thread's
    if FP8:
        k_tile = k_bufs.index(0)
        _decode(st, s, k_tile, num_warps)
        fence_async_shared()
        gl.thread_barrier()  # the whole tile decoded before the MMAs read it
    else:
        k_tile = k_bufs.index(s)
    return k_tile


@gjit
def _online_softmax(q_smem, k_tile, p_smem, valid, m, den, o, s_zero, qk_scale):
    # One tile into the online softmax (base 2): S = Q K^T, its valid columns, P through shared memory, O += P K.
    o_l: gl.constexpr = o.type.layout
    s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), s_zero, use_acc=False)
    s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=1))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(s - m_new[:, None])
    den = den * alpha + gl.sum(p, axis=1)
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()  # P whole before either warpgroup reads it
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
    o = warpgroup_mma(p_smem, k_tile, o)
    gl.thread_barrier()  # both warpgroups done with the stage and P before they are written again
    return m_new, den, o


@gjit
def _online_softmax_t(q_smem, k_tile, p_smem, valid, m, den, o, s_zero, qk_scale):
    # `_online_softmax` with the heads on the products' N (few heads: no padding to the MMA's 64 rows):
    # S^T = K Q^T [BLOCK_N, BLOCK_H], P^T through shared memory, O^T [D, BLOCK_H] += K^T P^T (K^T: the tile
    # read transposed, the MMA's A from shared memory)
    o_l: gl.constexpr = o.type.layout
    s = warpgroup_mma(k_tile, q_smem.permute((1, 0)), s_zero, use_acc=False)
    s = gl.where(valid[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=0))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(s - m_new[None, :])
    den = den * alpha + gl.sum(p, axis=0)
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()  # P^T whole before the MMA reads it
    o = o * gl.convert_layout(alpha, gl.SliceLayout(0, o_l))[None, :]
    o = warpgroup_mma(k_tile.permute((1, 0)), p_smem, o)
    gl.thread_barrier()  # done with the stage and P^T before they are written again
    return m_new, den, o


@gjit
def _store(o, den, t, cis_ptr, s_cis, out_ptr, s_out, H, D: gl.constexpr, DR: gl.constexpr, PDL: gl.constexpr,
           num_warps: gl.constexpr):
    # o [BLOCK_H, D] / den in the run dtype, then the inverse rotary of its last DR dims (GPT-J pairs) on the
    # rounded values
    BLOCK_H: gl.constexpr = o.shape[0]
    o_l: gl.constexpr = o.type.layout
    dt: gl.constexpr = out_ptr.dtype.element_ty
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    ob = (o / gl.convert_layout(den, gl.SliceLayout(1, o_l))[:, None]).to(dt)
    ob = gl.convert_layout(ob, out_l)
    heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, out_l))
    dims = gl.arange(0, D, layout=gl.SliceLayout(0, out_l))
    row = out_ptr + t * s_out + heads[:, None] * D
    pair_l: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [num_warps, 1], [1, 0])
    i = gl.arange(0, DR // 2, layout=gl.SliceLayout(0, pair_l))
    c = gl.load(cis_ptr + t * s_cis + 2 * i)
    sn = gl.load(cis_ptr + t * s_cis + 2 * i + 1)
    gl_pdl_trigger(PDL)
    gl.store(row + dims[None, :], ob, mask=(heads < H)[:, None])
    gl.thread_barrier()  # the rounded rows are visible to the whole program
    rotate_back(out_ptr, t, s_out, c, sn, H, BLOCK_H, D, DR, pair_l)


@gjit
def rotate_back(out_ptr, t, s_out, c, sn, H, BLOCK_H: gl.constexpr, D: gl.constexpr, DR: gl.constexpr,
                pair_l: gl.constexpr):
    """The inverse rotary of token t's output rows (BLOCK_H heads, H real): their last DR dims, stored rounded
    and visible to the calling threads, read back, rotated by the angles c, sn [DR / 2] (GPT-J pairs; pair_l's
    columns) in fp32 and rounded again; the torch twin's order (`apply_rotary(inverse=True)` on o in the run
    dtype)."""
    dt: gl.constexpr = out_ptr.dtype.element_ty
    i = gl.arange(0, DR // 2, layout=gl.SliceLayout(0, pair_l))
    hp = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, pair_l))
    at = out_ptr + t * s_out + hp[:, None] * D + (D - DR) + 2 * i[None, :]
    hm = (hp < H)[:, None]
    e = gl.load(at, mask=hm, other=0.0).to(gl.float32)
    od = gl.load(at + 1, mask=hm, other=0.0).to(gl.float32)
    gl.store(at, (e * c[None, :] + od * sn[None, :]).to(dt), mask=hm)
    gl.store(at + 1, (od * c[None, :] - e * sn[None, :]).to(dt), mask=hm)
