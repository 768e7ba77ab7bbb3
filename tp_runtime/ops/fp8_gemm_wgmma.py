"""Gluon (Triton's dialect with explicit layouts): the FP8 block-scaled GEMM on Hopper fed by TMA, two kernels: the
"wgmma" and "wgmma_ws" launches of the family in ops/fp8_gemm.py (same shapes, same semantics, torch twin
`fp8_gemm_torch`).

    xq     [Mp, groups*K] e4m3, x rounded per 1 x 128 block (`quantize_x`), xs its fp32 scales [Mp, groups*K/128]
    qw     [groups*N, K] e4m3, K a multiple of 128; scale [ceil(groups*N/128), K/128] e8m0 bytes
    y      [M, groups*N]

Why Gluon: each K block's product must be scaled before it is added (s_x[m, b] * s_w[n/128, b]), and Triton's
`tl.dot` then waits for every MMA as soon as it is issued, so a program's MMA, its scaling and its loads take
turns. "wgmma" (one set of warps) issues block b + 1's MMA (into a fresh accumulator, operands in shared memory),
then waits for block b's alone (`warpgroup_mma_wait(num_outstanding=1)`) and scales and adds it (IN_FLIGHT; large
tiles wait for each MMA instead). ptxas serializes those MMAs all the same (warning C7514: an in-flight MMA's
accumulator registers are read before the MMA completes), so in practice its overlap comes from the warpgroups
and the TMA stages. "wgmma_ws" is warp-specialized: a loading warp keeps the ring of stages full, independent of
the MMA warps, and under PDL requests the first weight tiles before it waits for the previous kernel; the MMA
warps issue K_PER_WAIT blocks' MMAs, each into its own product, wait for them together (no product is read
while an MMA is in flight, so nothing is serialized), scale and add them, and hand the stages back by mbarriers.
Nsight Compute at M = 128 (64 x 64 tiles, one program an SM): ~500 cycles a K block, of which the MMAs take
~130; the rest is the issue-wait-scale-release chain, which the blocks of one wait now share.
A tile of 256 weight rows spans two 128-row scale blocks: scales are per row. The weight tile is the MMA's wide
side ("swap AB": BLOCK_N weight rows by BLOCK_M rows of x), K is split over programs as in the Triton kernel
(partials summed by the last program of a tile, in split order). Only K a multiple of 128 (every DeepSeek-V4
weight); the host falls back to the Triton kernel otherwise.

On installs without Triton (or without Gluon) this module still imports; its kernel cannot run.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.kernel_support import gjit, gl, gl_pdl_trigger, gl_pdl_wait

try:
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_init, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:
    pass


def wgmma_fits(n: int, k: int, groups: int, block_n: int) -> bool:
    """The wgmma launch covers this weight: K a multiple of 128, a tile's rows inside one group."""
    return k % 128 == 0 and (n // groups) % block_n == 0


def fp8_gemm_wgmma(xq: torch.Tensor, xs: torch.Tensor, m: int, qw: torch.Tensor, scale: torch.Tensor,
                   groups: int, block_m: int, block_n: int, splits: int, num_warps: int, stages: int,
                   in_flight: int, y: torch.Tensor, part: torch.Tensor, counters: torch.Tensor) -> None:
    """y [m, groups*N] = the family's product of rounded x (xq, xs from `quantize_x`) and the FP8 weight; one
    launch. part: fp32 [splits, m, groups*N] where splits > 1; counters: int32 zeros, one per output tile.
    in_flight: 1 keeps one MMA in flight while the last is scaled (three fp32 tiles), 0 waits for each (two)."""
    n, k = qw.shape
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, 128], gl.float8e4nv)
    x_layout = gl.NVMMASharedLayout.get_default_for([block_m, 128], gl.float8e4nv)
    w_desc = TensorDescriptor.from_tensor(qw, [block_n, 128], w_layout)
    x_desc = TensorDescriptor.from_tensor(xq, [block_m, 128], x_layout)
    grid = (-(-m // block_m), -(-n // block_n), splits)
    steps = -(-(k // 128) // splits)
    _wgmma_kernel[grid](w_desc, x_desc, xs, scale, y, part, counters, m, n, k, n // groups, xs.stride(1),
                        scale.stride(0), steps, splits, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                        IN_FLIGHT=in_flight, num_warps=num_warps)


WS_LOAD_REGS = gl.constexpr(40) if gl is not None else 40  # registers a thread of the loading warp keeps (it
#                                                              holds offsets and barrier phases only)
WS_MAXNREG = 128  # the launch's registers a thread: two programs an SM (4 MMA warps); they take 232 from the
#                   loading warpgroup's share (setmaxnreg), enough for two fp32 tiles of up to 8192 values
WS_MAX_TILE = 8192  # BLOCK_N x BLOCK_M per MMA warpgroup: its accumulator and product, 64 registers a thread each


def fp8_gemm_wgmma_ws(xq: torch.Tensor, xs: torch.Tensor, m: int, qw: torch.Tensor, scale: torch.Tensor,
                      groups: int, block_m: int, block_n: int, splits: int, num_warps: int, stages: int,
                      k_per_wait: int, pdl: bool, y: torch.Tensor, part: torch.Tensor, counters: torch.Tensor) -> None:
    """`fp8_gemm_wgmma`'s product by the warp-specialized kernel: one loading warp feeds the stages by TMA (the
    weight tiles first, before the PDL wait, since no earlier kernel writes them), num_warps MMA warps consume
    them, k_per_wait steps' MMAs issued before one wait (a ring of at least twice that many stages). xs must be
    `quantize_x`'s scales with M padded to 4 rows (16-byte TMA rows)."""
    if stages < 2 * k_per_wait:
        raise ValueError(f"fp8_gemm_wgmma_ws: {stages} stages for {k_per_wait} steps a wait (at least twice as many)")
    n, k = qw.shape
    xs_rows = xs.t()  # [groups*K/128, Mp]: one row of x scales per K block, contiguous (quantize_x's layout)
    w_desc = TensorDescriptor.from_tensor(qw, [block_n, 128],
                                          gl.NVMMASharedLayout.get_default_for([block_n, 128], gl.float8e4nv))
    x_desc = TensorDescriptor.from_tensor(xq, [block_m, 128],
                                          gl.NVMMASharedLayout.get_default_for([block_m, 128], gl.float8e4nv))
    s_desc = TensorDescriptor.from_tensor(xs_rows, [1, max(block_m, 32)],  # 128-byte stages: TMA's alignment
                                          gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    grid = (-(-m // block_m), -(-n // block_n), splits)
    steps = -(-(k // 128) // splits)
    _ws_kernel[grid](w_desc, x_desc, s_desc, scale, y, part, counters, m, n, k, n // groups, scale.stride(0), steps,
                     splits, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, KPW=k_per_wait, PDL=pdl,
                     num_warps=num_warps, launch_pdl=pdl, maxnreg=WS_MAXNREG)


@gjit
def _ws_kernel(w_desc, x_desc, s_desc, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, GROUP_N, stride_sn, STEPS, SPLITS,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KPW: gl.constexpr,
               PDL: gl.constexpr, num_warps: gl.constexpr):
    # One program: y^T tile [BLOCK_N weight rows, BLOCK_M rows of x] over K blocks [lo, lo + n_steps) of its group.
    # Stage s holds a weight tile [BLOCK_N, 128], an x tile [BLOCK_M, 128] and x's scales [1, >= BLOCK_M]; ready[s]
    # completes when its three TMA copies have landed, empty[s] when the MMA that read it has completed.
    pid_m, pid_n, split = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
    group = off_n // GROUP_N
    lo = split * STEPS
    n_steps = gl.minimum(lo + STEPS, K // 128) - lo
    kb0 = group * (K // 128) + lo  # x's first K block (its columns and scale row) of this program
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 128], w_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, 128], x_desc.layout)
    s_bufs = gl.allocate_shared_memory(s_desc.dtype, [STAGES] + s_desc.block_type.shape, s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    n_fill = (n_steps + KPW - 1) // KPW * KPW  # stages the loader fills: whole waits' worth (the last scaled by 0)
    acc = gl.warp_specialize([
        (_ws_mma, (w_bufs, x_bufs, s_bufs, ready, empty, s_ptr, stride_sn, off_n, lo, n_steps, STAGES, KPW,
                   num_warps)),
        (_ws_load, (w_desc, x_desc, s_desc, w_bufs, x_bufs, s_bufs, ready, empty, off_n, off_m, lo, kb0, n_fill,
                    STAGES, PDL)),
    ], [1], [WS_LOAD_REGS])[0]
    gl_pdl_wait(PDL)  # (the loading warp waited before its first x tile; the partials and counters follow it)
    gl_pdl_trigger(PDL)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    _store_or_sum(acc, y_ptr, part_ptr, cnt_ptr + pid_n * gl.num_programs(0) + pid_m, off_m, off_n, M, N, split,
                  SPLITS, BLOCK_M, BLOCK_N, num_warps)


@gjit
def _ws_load(w_desc, x_desc, s_desc, w_bufs, x_bufs, s_bufs, ready, empty, off_n, off_m, lo, kb0, n_steps,
             STAGES: gl.constexpr, PDL: gl.constexpr):
    # The loading warp. Every stage is free at the start: the first STAGES weight tiles are requested before the
    # PDL wait (weights are no earlier kernel's output), so they stream while the previous kernel finishes.
    nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes + s_desc.block_type.nbytes
    first = gl.minimum(n_steps, STAGES)
    for j in range(first):
        mbarrier.expect(ready.index(j), nbytes)
        tma.async_copy_global_to_shared(w_desc, [off_n, (lo + j) * 128], ready.index(j), w_bufs.index(j))
    gl_pdl_wait(PDL)
    for j in range(first):
        _load_x(x_desc, s_desc, x_bufs, s_bufs, ready, j, j, off_m, kb0)
    for j in range(first, n_steps):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)  # the MMA of step j - STAGES has completed
        mbarrier.expect(ready.index(slot), nbytes)
        tma.async_copy_global_to_shared(w_desc, [off_n, (lo + j) * 128], ready.index(slot), w_bufs.index(slot))
        _load_x(x_desc, s_desc, x_bufs, s_bufs, ready, slot, j, off_m, kb0)


@gjit
def _load_x(x_desc, s_desc, x_bufs, s_bufs, ready, slot, j, off_m, kb0):
    # Step j's x tile and x's scales for it into stage `slot` (x rows past Mp and scales past it read as zeros)
    tma.async_copy_global_to_shared(x_desc, [off_m, (kb0 + j) * 128], ready.index(slot), x_bufs.index(slot))
    tma.async_copy_global_to_shared(s_desc, [kb0 + j, off_m], ready.index(slot), s_bufs.index(slot))


@gjit
def _ws_mma(w_bufs, x_bufs, s_bufs, ready, empty, s_ptr, stride_sn, off_n, lo, n_steps, STAGES: gl.constexpr,
            KPW: gl.constexpr, num_warps: gl.constexpr):
    # The MMA warps (one warpgroup, or two in step, each 64 of every 128 weight rows), KPW steps at a time: the
    # steps' MMAs are issued side by side, each into its own product, and waited for together; each product is
    # scaled by x's scales (from its stage) and the weight's and added, and the stages are handed back to the
    # loading warp. One wait per KPW steps: a step's MMA, its wait, its scaling and the hand-back are a chain of
    # latencies (~500 cycles a step measured at 64 x 64 tiles, where the MMA itself takes ~130), which the MMAs
    # of the other steps now share. No product is read while an MMA is in flight (ptxas would serialize them:
    # warning C7514). Steps past n_steps (the loader fills them too) are scaled by 0.
    BLOCK_N: gl.constexpr = w_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = x_bufs.type.shape[1]
    SX: gl.constexpr = s_bufs.type.shape[2]  # x's scales a stage holds (>= BLOCK_M; the first BLOCK_M are the tile's)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BLOCK_M, 32])
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)  # [BLOCK_N]: one per weight row (a 256-row tile spans 2 blocks)
    s_rows = s_ptr + ((off_n + gl.arange(0, BLOCK_N, layout=row_l)) // 128) * stride_sn + lo
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_l)
    acc = zero
    for i0 in range(0, n_steps, KPW):
        sw = _ws_weight_scales(s_rows, i0, n_steps, KPW)  # issued first: their latency hides behind the MMAs
        prods = ()
        for j in gl.static_range(KPW):
            slot = (i0 + j) % STAGES
            mbarrier.wait(ready.index(slot), ((i0 + j) // STAGES) & 1)
            prods = prods + (warpgroup_mma(w_bufs.index(slot), x_bufs.index(slot).permute((1, 0)), zero,
                                           use_acc=False, is_async=True), )
        prods = warpgroup_mma_wait(num_outstanding=0, deps=prods)
        if KPW == 1:
            prods = (prods, )
        for j in gl.static_range(KPW):
            sx = s_bufs.index((i0 + j) % STAGES).reshape([SX]).slice(0, BLOCK_M).load(gl.SliceLayout(0, acc_l))
            acc += prods[j] * sw[j][:, None] * sx[None, :]
        gl.thread_barrier()  # every MMA warp is past the stages' MMAs and their x scales
        fence_async_shared()  # (those reads ordered before the loader's next TMA writes of the stages)
        for j in gl.static_range(KPW):
            mbarrier.arrive(empty.index((i0 + j) % STAGES), count=1)
    return (acc, )


@gjit
def _ws_weight_scales(s_rows, i0, n_steps, KPW: gl.constexpr):
    # The weight's fp32 scales of steps i0 .. i0 + KPW - 1 (0 past n_steps), one [BLOCK_N] tensor a step
    out = ()
    for j in gl.static_range(KPW):
        ok = i0 + j < n_steps
        b = gl.load(s_rows + i0 + j, mask=ok, other=127)
        out = out + (gl.where(ok, gl.exp2(b.to(gl.float32) - 127.0), 0.0), )
    return out


@gjit
def _load_stage(w_desc, x_desc, w_bufs, x_bufs, ready, j, lo, n_steps, off_n, off_m, xk0,
                STAGES: gl.constexpr):
    # Step j's weight and x tiles into stage j % STAGES (nothing past the program's last step).
    slot = j % STAGES
    pred = j < n_steps
    bar = ready.index(slot)
    mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, (lo + j) * 128], bar, w_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(x_desc, [off_m, xk0 + (lo + j) * 128], bar, x_bufs.index(slot), pred=pred)


@gjit
def _wgmma_kernel(w_desc, x_desc, xs_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, GROUP_N, stride_xsk, stride_sn,
                  STEPS, SPLITS, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  IN_FLIGHT: gl.constexpr, num_warps: gl.constexpr):
    # One program: y^T tile [BLOCK_N weight rows, BLOCK_M rows of x] over K blocks [lo, hi) of its group.
    pid_m, pid_n, split = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
    group = off_n // GROUP_N
    lo = split * STEPS
    n_steps = gl.minimum(lo + STEPS, K // 128) - lo
    xk0 = group * K  # x's columns of this group
    xs_ptr += (group * (K // 128) + lo) * stride_xsk

    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BLOCK_M, 32])
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)  # [BLOCK_M]: one scale per row of x
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)  # [BLOCK_N]: one per weight row (a 256-row tile spans 2 blocks)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 128], w_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, 128], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES - 1):
        _load_stage(w_desc, x_desc, w_bufs, x_bufs, ready, i, lo, n_steps, off_n, off_m, xk0, STAGES)

    rm = off_m + gl.arange(0, BLOCK_M, layout=col_l)
    rn = off_n + gl.arange(0, BLOCK_N, layout=row_l)
    m_ok = rm < M
    s_rows = s_ptr + (rn // 128) * stride_sn + lo  # [BLOCK_N] pointers to each row's block scales
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_l)
    acc = zero
    if IN_FLIGHT:
        # Step i's MMA is issued before step i - 1's product is waited for, scaled and added.
        prod = warpgroup_mma_init(zero)  # the previous step's product, in flight until waited for
        sx_prev = gl.zeros([BLOCK_M], gl.float32, col_l)
        sw_prev = gl.zeros([BLOCK_N], gl.float32, row_l)
        for i in range(n_steps):
            new, sx, sw = _issue(w_bufs, x_bufs, ready, zero, i, xs_ptr, s_rows, stride_xsk, rm, m_ok, STAGES)
            prod = warpgroup_mma_wait(num_outstanding=1, deps=(prod,))  # step i - 1's MMA done; step i's runs on
            acc += prod * sw_prev[:, None] * sx_prev[None, :]
            _load_stage(w_desc, x_desc, w_bufs, x_bufs, ready, i + STAGES - 1, lo, n_steps, off_n, off_m, xk0,
                        STAGES)  # into step i - 1's stage, whose MMA has completed
            prod = new
            sx_prev = sx
            sw_prev = sw
        prod = warpgroup_mma_wait(num_outstanding=0, deps=(prod,))
        acc += prod * sw_prev[:, None] * sx_prev[None, :]
    else:
        # Each MMA waited for at once: two fp32 tiles, not three (large tiles); warpgroups still overlap.
        for i in range(n_steps):
            new, sx, sw = _issue(w_bufs, x_bufs, ready, zero, i, xs_ptr, s_rows, stride_xsk, rm, m_ok, STAGES)
            prod = warpgroup_mma_wait(num_outstanding=0, deps=(new,))
            _load_stage(w_desc, x_desc, w_bufs, x_bufs, ready, i + STAGES - 1, lo, n_steps, off_n, off_m, xk0,
                        STAGES)  # into step i - 1's stage
            acc += prod * sw[:, None] * sx[None, :]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    _store_or_sum(acc, y_ptr, part_ptr, cnt_ptr + pid_n * gl.num_programs(0) + pid_m, off_m, off_n, M, N, split,
                  SPLITS, BLOCK_M, BLOCK_N, num_warps)


@gjit
def _issue(w_bufs, x_bufs, ready, zero, i, xs_ptr, s_rows, stride_xsk, rm, m_ok, STAGES: gl.constexpr):
    # Step i: wait for its stage's tiles, issue its MMA into a fresh accumulator (returned in flight), and load its
    # scales meanwhile.
    slot = i % STAGES
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    new = warpgroup_mma(w_bufs.index(slot), x_bufs.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
    sx, sw = _scales(xs_ptr, s_rows, i, stride_xsk, rm, m_ok)
    return new, sx, sw


@gjit
def _scales(xs_ptr, s_rows, i, stride_xsk, rm, m_ok):
    # Step i's scales: x's per row [BLOCK_M] (fp32) and the weight's per row [BLOCK_N] (e8m0 bytes -> 2^(v - 127))
    sx = gl.load(xs_ptr + i * stride_xsk + rm, mask=m_ok, other=0.0)
    sw = gl.exp2(gl.load(s_rows + i).to(gl.float32) - 127.0)
    return sx, sw


@gjit
def _store_or_sum(acc, y_ptr, part_ptr, cnt_ptr, off_m, off_n, M, N, split, SPLITS, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
    # ops/linear.py's `store_or_sum` for the tile [BLOCK_N, BLOCK_M] of y^T: one split stores it; several write
    # fp32 partials, and the last to finish (an atomic count) sums them in split order and resets the count.
    # 4 consecutive columns of y (n, contiguous) a thread: vector stores and loads, and few pointers held
    out_l: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, num_warps], [0, 1])
    t = gl.convert_layout(acc, out_l)
    rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_l))
    rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l))
    offs = rm[None, :] * N + rn[:, None]
    mask = (rm < M)[None, :] & (rn < N)[:, None]
    if SPLITS == 1:
        gl.store(y_ptr + offs, t.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        plane = M * N
        gl.store(part_ptr + split * plane + offs, t, mask=mask, cache_modifier=".wt")
        gl.thread_barrier()  # every thread's partial is written before the count moves
        if gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            # summed 16 weight rows at a time: the whole tile's sums, loads and addresses at once would take
            # ~90 more registers per thread than the main loop, and the kernel is allocated for its peak
            sum_l: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [1, num_warps], [0, 1])
            rm_c = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, sum_l))
            for c in range(BLOCK_N // 16):
                rn_c = off_n + c * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, sum_l))
                offs_c = rm_c[None, :] * N + rn_c[:, None]
                mask_c = (rm_c < M)[None, :] & (rn_c < N)[:, None]
                tot = gl.zeros([16, BLOCK_M], gl.float32, sum_l)
                for s in range(SPLITS):
                    tot += gl.load(part_ptr + s * plane + offs_c, mask=mask_c, other=0.0, cache_modifier=".cv")
                gl.store(y_ptr + offs_c, tot.to(y_ptr.dtype.element_ty), mask=mask_c)
            gl.atomic_xchg(cnt_ptr, 0)
