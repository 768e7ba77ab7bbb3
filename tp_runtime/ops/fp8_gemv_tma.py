"""Gluon: the FP8 block-scaled GEMV fed by TMA, the "gemv_tma" launch of the family in ops/fp8_gemm.py (one row of x,
the family's semantics, torch twin `fp8_gemm_torch`).

    x      [1, groups*K] bf16 / fp16 / fp32
    qw     [groups*N, K] e4m3, K a multiple of 128; scale [ceil(groups*N/128), K/128] e8m0 bytes
    y      [1, groups*N] in x's dtype

At M = 1 a weight GEMM streams its weight once, and how close it comes to HBM's speed depends on how many bytes
each SM keeps in flight. ops/linear.py's Triton GEMV holds one weight tile at a time in registers. Here a program
keeps a ring of STAGES weight tiles [BLOCK_N, 128] in shared memory, each requested by one TMA copy (no registers
held while it flies). The first STAGES are requested before the PDL wait: no kernel of a step writes a weight
(ops/linear.py's module doc), so they stream while the kernel before finishes.

A step's CUDA-core work: widen the landed tile to fp32, multiply by x's 128 columns, add into an fp32 tile
[BLOCK_N, 128] that is summed over its columns once after the K loop. x's columns are rounded to e4m3 per 1 x 128
block as they are read (ops/act_quant.py's rounding: the family's products are those of the FP8 operands, exact in
fp32) and times both block scales (powers of two: exact). The layout gives a warp 4 rows x 128 columns, 16
consecutive bytes a thread: one 16-byte shared-memory read per row a thread, and x's whole block, its amax (warp
shuffles) and its scale in every warp. So a step needs no shared-memory barrier, but the one before its stage is
refilled (every warp has read it). x's block and the weight block's scale are loaded a step ahead.

K is split over programs where the rows leave SMs idle: fp32 partials summed in split order by the last program
of a row tile to finish (ops/linear.py's `store_or_sum`, here for one row). K a multiple of 128 only (every
DeepSeek-V4 weight), a tile's rows inside one 128-row scale block and one group.

On installs without Triton (or without Gluon) this module still imports; its kernel cannot run.
"""

from __future__ import annotations

import torch

from tp_runtime.ops.kernel_support import gjit, gl, gl_pdl_trigger, gl_pdl_wait

try:
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:
    pass

GEMV_TMA_ROWS = (16, 32, 64, 128)  # BLOCK_N: inside one 128-row scale block; 4 rows a warp


def gemv_tma_fits(n: int, k: int, groups: int, block_n: int, num_warps: int) -> bool:
    """The launch covers this weight: K a multiple of 128, a tile's rows inside one group and one scale block, at
    least a row a thread group (4 rows a warp)."""
    return (k % 128 == 0 and block_n in GEMV_TMA_ROWS and (n // groups) % block_n == 0
            and block_n >= 4 * num_warps)


def fp8_gemv_tma(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int, block_n: int, splits: int,
                 stages: int, num_warps: int, pdl: bool, y: torch.Tensor, part: torch.Tensor,
                 counters: torch.Tensor) -> None:
    """y [1, groups*N] = the family's product of x [1, groups*K] and the FP8 weight; one launch. part: fp32
    [splits, 1, groups*N] where splits > 1; counters: int32 zeros, one per tile of block_n rows."""
    n, k = qw.shape
    w_desc = TensorDescriptor.from_tensor(qw, [block_n, 128],
                                          gl.NVMMASharedLayout.get_default_for([block_n, 128], gl.float8e4nv))
    grid = (-(-n // block_n), splits)
    steps = -(-(k // 128) // splits)
    _gemv_tma_kernel[grid](w_desc, x, scale, y, part, counters, n, k, n // groups, scale.stride(0), steps, splits,
                           BLOCK_N=block_n, STAGES=stages, PDL=pdl, num_warps=num_warps, launch_pdl=pdl)


@gjit
def _gemv_tma_kernel(w_desc, x_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, N, K, GROUP_N, stride_sn, STEPS, SPLITS,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
    # One program: rows [off_n, off_n + BLOCK_N) of y over K blocks [lo, lo + n_steps) of its group (an empty last
    # split has none: it adds zeros). ready[s] completes when stage s's tile has landed.
    pid_n, split = gl.program_id(0), gl.program_id(1)
    off_n = pid_n * BLOCK_N
    lo = split * STEPS
    n_steps = gl.minimum(lo + STEPS, K // 128) - lo
    bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 128], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        _request(w_desc, bufs, ready, i, off_n, lo, n_steps, STAGES)
    gl_pdl_wait(PDL)

    tile_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, tile_l))
    x_at = x_ptr + (off_n // GROUP_N) * K + lo * 128 + cols  # [128] this program's first block of x
    s_at = s_ptr + (off_n // 128) * stride_sn + lo  # the tile's weight scale of that block
    xv = _x_block(x_at, cols, 0, n_steps)
    sw = gl.load(s_at, mask=n_steps > 0, other=127)
    acc = gl.zeros([BLOCK_N, 128], gl.float32, tile_l)
    for i in range(n_steps):
        xr = _rounded(xv, sw)
        xv = _x_block(x_at, cols, i + 1, n_steps)  # the next step's, in flight during this one
        sw = gl.load(s_at + i + 1, mask=i + 1 < n_steps, other=127)
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc += bufs.index(slot).load(tile_l).to(gl.float32) * xr[None, :]
        if i + STAGES < n_steps:
            gl.thread_barrier()  # every warp has read the stage
            fence_async_shared()  # (those reads ordered before the TMA's write of it)
            _request(w_desc, bufs, ready, i + STAGES, off_n, lo, n_steps, STAGES)
    gl_pdl_trigger(PDL)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    rows = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, tile_l))
    _store_or_sum_row(gl.sum(acc, axis=1), y_ptr, part_ptr, cnt_ptr + pid_n, rows, N, split, SPLITS)


@gjit
def _request(w_desc, bufs, ready, j, off_n, lo, n_steps, STAGES: gl.constexpr):
    # Step j's weight tile [BLOCK_N, 128] into stage j % STAGES (nothing past the program's last step).
    slot = j % STAGES
    pred = j < n_steps
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, (lo + j) * 128], ready.index(slot), bufs.index(slot), pred=pred)


@gjit
def _x_block(x_at, cols, i, n_steps):
    # x's 128 columns of step i as fp32 (zeros past the program's last step)
    return gl.load(x_at + i * 128, mask=cols < (n_steps - i) * 128, other=0.0).to(gl.float32)


@gjit
def _rounded(xv, sw):
    # x's block [128] fp32 -> its e4m3 rounding (ops/act_quant.py: a power-of-two scale 2^e from amax's bits) times
    # 2^e and the weight block's scale 2^(sw - 127): exact in fp32, as ops/linear.py's GEMV computes it
    amax = gl.maximum(gl.max(gl.abs(xv), axis=0), 1e-4)
    bits = amax.to(gl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(gl.int32)
    q = (xv * ((127 - e) << 23).to(gl.float32, bitcast=True)).to(gl.float8e4nv)
    return q.to(gl.float32) * ((e + 127) << 23).to(gl.float32, bitcast=True) * gl.exp2(sw.to(gl.float32) - 127.0)


@gjit
def _store_or_sum_row(out, y_ptr, part_ptr, cnt_ptr, rows, N, split, SPLITS):
    # ops/linear.py's `store_or_sum` for one row of y: one split stores it; several write fp32 partials, and the
    # last to finish (an atomic count) sums them in split order, stores y and resets the count.
    ok = rows < N
    if SPLITS == 1:
        gl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        gl.store(part_ptr + split * N + rows, out, mask=ok, cache_modifier=".wt")
        gl.thread_barrier()  # every thread's partial is written before the count moves
        if gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            tot = gl.zeros_like(out)
            for s in range(SPLITS):
                tot += gl.load(part_ptr + s * N + rows, mask=ok, other=0.0, cache_modifier=".cv")
            gl.store(y_ptr + rows, tot.to(y_ptr.dtype.element_ty), mask=ok)
            gl.atomic_xchg(cnt_ptr, 0)
