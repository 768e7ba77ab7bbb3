"""Gluon: the FP8 GEMV at M = 1 with its weight streamed by TMA through a ring of shared-memory stages, the
"gemv_tma" launch of ops/fp8_gemm.py's family (same semantics, torch twin `fp8_gemm_torch`).

    x      [1, groups*K]  bf16 / fp16 / fp32, rounded here per 1 x 128 block as ops/act_quant.py's `round_block`
    qw     [groups*N, K]  e4m3, K a multiple of 128; scale [ceil(groups*N/128), K/128] e8m0 bytes
    y      [1, groups*N]

Why: a decode step at batch 1 reads each weight once, so its GEMMs are bound by how many bytes are in flight to
each SM. The Triton GEMV (ops/linear.py) loads a step's weight tile into registers and uses it at once; its
registers allow about 32 KB in flight an SM, which holds it near half the read bandwidth. Here TMA fills STAGES
tiles ahead into shared memory (the first ones before the PDL wait: no kernel of a step writes a weight), so a
program keeps STAGES x BLOCK_N x BLOCK_K bytes in flight whatever its registers.

A program: output rows [off_n, off_n + BLOCK_N) (inside one 128-row scale block and one group) over K steps of
BLOCK_K columns, [lo, lo + n_steps) of its split. Each step it reads the stage into registers as a
[BLOCK_N, BLOCK_K/128, 128] tile (a thread holds 16 consecutive bytes of a row; 8 lanes span a 128-column block),
releases the stage to the next TMA copy, rounds its 128-column blocks of x in registers (the block maxima by warp
shuffles: the block's lanes are in one warp, so no shared memory and no barrier), folds x's and the weight's
power-of-two scales into x (exact), and adds the products to an fp32 tile summed once at the end. K splits
leave fp32 partials that the last program of a row tile sums in split order (ops/linear.py's `store_or_sum`).

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

TMA_BOX = 256  # a TMA box spans at most 256 elements a dimension: BLOCK_N's bound


def gemv_tma_fits(n: int, k: int, groups: int, block_n: int) -> bool:
    """The launch covers this weight: K a multiple of 128, a tile's rows inside one group and one scale block."""
    return k % 128 == 0 and (n // groups) % block_n == 0 and 128 % block_n == 0


def fp8_gemv_tma(x2: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int, block_n: int, block_k: int,
                 splits: int, num_warps: int, stages: int, pdl: bool, y: torch.Tensor, part: torch.Tensor,
                 counters: torch.Tensor) -> None:
    """y [1, groups*N] = the family's product of x2 [1, groups*K] (rounded here) and the FP8 weight; one launch.
    part: fp32 [splits, 1, groups*N] where splits > 1; counters: int32 zeros, one per row tile."""
    n, k = qw.shape
    kb = block_k // 128
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)
    w_desc = TensorDescriptor.from_tensor(qw.view(n, k // 128, 128), [block_n, kb, 128], layout)
    steps = -(-(-(-k // block_k)) // splits)
    grid = (-(-n // block_n), splits)
    _gemv_tma_kernel[grid](w_desc, x2, scale, y, part, counters, n, k, n // groups, scale.stride(0), steps, splits,
                           BLOCK_N=block_n, KB=kb, STAGES=stages, PDL=pdl, num_warps=num_warps, launch_pdl=pdl)


@gjit
def _gemv_tma_kernel(w_desc, x_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, N, K, GROUP_N, stride_sn, STEPS, SPLITS,
                     BLOCK_N: gl.constexpr, KB: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr,
                     num_warps: gl.constexpr):
    # ready[s] completes when stage s's weight tile [BLOCK_N, KB, 128] has landed.
    pid_n, split = gl.program_id(0), gl.program_id(1)
    off_n = pid_n * BLOCK_N
    x_ptr += (off_n // GROUP_N) * K
    s_row = s_ptr + (off_n // 128) * stride_sn
    lo = split * STEPS
    n_steps = gl.minimum(lo + STEPS, (K + KB * 128 - 1) // (KB * 128)) - lo
    # a thread: 16 consecutive bytes of a row; 8 lanes a 128-column block; the warp's other lanes more blocks
    # (up to 4), then more rows; warps over rows
    TB: gl.constexpr = 4 if KB >= 4 else KB
    w_l: gl.constexpr = gl.BlockedLayout([1, 1, 1, 16], [32 // (8 * TB), TB, 8, 1], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    x_l: gl.constexpr = gl.SliceLayout(0, w_l)  # [KB, 8, 16]: a step's x, held as the tile's rows need it
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, KB, 128], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):  # before the wait: weights are no earlier kernel's output
        _load_stage(w_desc, w_bufs, ready, i, lo, n_steps, off_n, STAGES)
    gl_pdl_wait(PDL)
    blk = gl.arange(0, KB, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l)))  # [KB]: the step's blocks
    lane = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_l)))  # [8]: 16 columns each
    byte = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l)))  # [16]: a thread's columns
    col = (blk[:, None] * 128 + lane[None, :] * 16)[:, :, None] + byte[None, None, :]  # [KB, 8, 16]
    acc = gl.zeros([BLOCK_N, KB, 8], gl.float32, gl.SliceLayout(3, w_l))
    for i in range(n_steps):
        kb0 = (lo + i) * KB  # the step's first 128-column block
        xv = _rounded_x(x_ptr, s_row, kb0, blk, col, K)
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        w = w_bufs.index(slot).reshape([BLOCK_N, KB, 8, 16]).load(w_l)
        gl.thread_barrier()  # every warp has read the stage
        fence_async_shared()  # (those reads ordered before the TMA write that refills it)
        _load_stage(w_desc, w_bufs, ready, i + STAGES, lo, n_steps, off_n, STAGES)
        acc += gl.sum(w.to(gl.float32) * xv[None, :, :, :], axis=3)
    gl_pdl_trigger(PDL)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    out_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    rows = gl.convert_layout(gl.sum(gl.sum(acc, axis=2), axis=1), out_l)
    rn = off_n + gl.arange(0, BLOCK_N, layout=out_l)
    _store_or_sum_row(rows, y_ptr, part_ptr, cnt_ptr + pid_n, rn, rn < N, split, N, SPLITS)


@gjit
def _load_stage(w_desc, w_bufs, ready, j, lo, n_steps, off_n, STAGES: gl.constexpr):
    # Step j's weight tile into stage j % STAGES (nothing past the program's last step; columns past K: zeros).
    KB: gl.constexpr = w_bufs.type.shape[2]
    slot = j % STAGES
    pred = j < n_steps
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, (lo + j) * KB, 0], ready.index(slot), w_bufs.index(slot),
                                    pred=pred)


@gjit
def _rounded_x(x_ptr, s_row, kb0, blk, col, K):
    # x's blocks kb0 .. kb0 + KB - 1 as [KB, 128] fp32: each rounded to e4m3 with its power-of-two scale (the bits
    # of ops/act_quant.py's `round_block`), times that scale and the weight's for the block: exact in fp32.
    c = kb0 * 128 + col
    x = gl.load(x_ptr + c, mask=c < K, other=0.0).to(gl.float32)
    bits = gl.maximum(gl.max(gl.max(gl.abs(x), axis=2), axis=1), 1e-4).to(gl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(gl.int32)
    inv = ((127 - e) << 23).to(gl.float32, bitcast=True)
    q = (x * inv[:, None, None]).to(gl.float8e4nv).to(gl.float32)
    b = kb0 + blk
    sw = gl.exp2(gl.load(s_row + b, mask=b * 128 < K, other=127).to(gl.float32) - 127.0)
    return q * (((e + 127) << 23).to(gl.float32, bitcast=True) * sw)[:, None, None]


@gjit
def _store_or_sum_row(v, y_ptr, part_ptr, cnt_ptr, rn, mask, split, N, SPLITS):
    # ops/linear.py's `store_or_sum` for one row of y: one split stores it; several write fp32 partials, and the
    # last to finish (an atomic count) sums them in split order and resets the count.
    if SPLITS == 1:
        gl.store(y_ptr + rn, v.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        gl.store(part_ptr + split * N + rn, v, mask=mask, cache_modifier=".wt")
        gl.thread_barrier()  # every thread's partial is written before the count moves
        if gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            tot = gl.zeros_like(v)
            for s in range(SPLITS):
                tot += gl.load(part_ptr + s * N + rn, mask=mask, other=0.0, cache_modifier=".cv")
            gl.store(y_ptr + rn, tot.to(y_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(cnt_ptr, 0)
