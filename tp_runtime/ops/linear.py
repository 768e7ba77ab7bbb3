"""Weight GEMMs y = x @ W^T for decode and prefill: FP8 block-scaled weights as released, and the
grouped bf16 GEMM of wo_a; the torch path beside them.

    x      [M, K]   bf16 / fp16 / fp32 activations ([M, groups*K] for a grouped GEMM, as wo_a's)
    W      [N, K]   run dtype, or qw float8_e4m3fn with
    scale  [ceil(N/128), ceil(K/128)] uint8 e8m0 bytes v: the 128 x 128 block's scale is 2^(v - 127)
    y      [M, N]   in x's dtype; grouped: output columns [g*N/groups, (g+1)*N/groups) read x's columns
                    [g*K, (g+1)*K)

`fp8_linear` computes these GEMMs on x as given (bf16 products of x and the widened weight, exactly the
dequantize-then-matmul result up to fp32 summation order), by M (measured on an H200, benchmarks/fp8_gemm.py):

- "gemv" (M = 1, CUDA): a Triton GEMV, fp32 products on CUDA cores; x times the block scales (powers of two:
  exact), the FP8 values only widened. It also serves ops/fp8_gemm.py at M = 1 (`round_x`): each 128 columns of
  x rounded to e4m3 as they are read (ops/act_quant.py), so its products are those of the FP8 operands.
- "tile" (M > 1): a Triton tl.dot kernel with bf16 activations, the weight tile widened in registers and its
  block's scale applied to the tile's fp32 product. The weight is the MMA's 64-row side and x the narrow one
  ("swap AB"), so M = 2..16 pads to 16 columns, not 64 rows.
- "torch" (no CUDA or no Triton): dequantize, then plain matmuls: the semantics, and the CPU tests' path.

The released model instead rounds x to e4m3 per 1 x 128 block and multiplies on FP8 tensor cores
(runtime.fp8_activations=e4m3): that family is ops/fp8_gemm.py; which of the two a GEMM takes is the kernel
backend's choice (ops/select.py), made once per run.

At decode sizes a matrix has too few output tiles to fill the GPU with long serial K loops, so both Triton
kernels split K over programs that write fp32 partials [S, M, N]; the last program of a tile to finish
(counted by an atomic per tile) sums them in split order (deterministic), casts and stores, and resets its
counter for the next call: one launch a GEMM.

The Triton kernels also take bf16 weights (scale None), a reference in the benchmark: measured on an H200
they are slower than cuBLAS there, so bf16 weights go to cuBLAS: `grouped_linear` is one strided batched
GEMM over views of x and of y, without copies.

PDL (ops/kernel_support.py; `pdl=True`): the GEMV and tile kernels wait before their first load of anything a
kernel may write (x is the previous kernel's output; the split-K counters are reset by the previous GEMM) and
trigger after their K loop, the last load of x and of the weight, before the partials are written and summed.
The GEMV loads its first weight tile before the wait: weights are no kernel's output within a step (they are
written when the model is built, before its first step), so a PDL launch may read a weight early whenever the
kernel launched just before it did not write that weight. cuBLAS (`grouped_linear`) takes no part: it launches
without the attribute and its successor starts after it as usual.
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch

from tp_runtime.ops.act_quant import BLOCK, round_block
from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, sm_count, tl, triton

# BLOCK (128): the checkpoint's quantization block, rows and columns; also the kernels' K step


def e8m0_scales(scale: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 bytes -> float32 2^(v - 127), exactly (v = 0 is 2^-127)."""
    bits = (scale.to(torch.int32) << 23).view(torch.float32)
    return torch.where(scale == 0, 2.0 ** -127, bits)


def dequantize(qw: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """qw [N, K] fp8, scale [ceil(N/128), ceil(K/128)] e8m0 -> W [N, K] in dtype (exact in bf16 and fp32)."""
    n, k = qw.shape
    s = e8m0_scales(scale).repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (qw.to(torch.float32) * s).to(dtype)


def grouped_linear(x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    """x [M, groups*K] @ W [groups*N, K]^T group by group -> [M, groups*N], W in x's dtype: one batched
    GEMM reading x's groups and writing y's in place (strided views [groups, M, K] and [groups, M, N])."""
    m, n = x.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    torch.bmm(x.view(m, groups, -1).transpose(0, 1), w.view(groups, n // groups, -1).transpose(1, 2),
              out=y.view(m, groups, n // groups).transpose(0, 1))
    return y


def fp8_linear_torch(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    w = dequantize(qw, scale, x.dtype)
    return torch.nn.functional.linear(x, w) if groups == 1 else grouped_linear(x, w, groups)


def fp8_path(m: int, x: torch.Tensor) -> str:
    """The path an FP8 GEMM of M rows on x as given takes on x's device: "torch" | "gemv" | "tile"."""
    if not (x.is_cuda and triton is not None):
        return "torch"
    return "gemv" if m == 1 else "tile"


def fp8_linear(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1,
               pdl: bool = False) -> torch.Tensor:
    """x [M, groups*K] @ dequantized qw [groups*N, K]^T, group by group -> [M, groups*N] (groups = 1: a plain
    linear; wo_a of DSV4: group g's output columns read x's columns of group g), x as given. pdl: the Triton
    launches with programmatic dependent launch (resolve_pdl; bitwise the same output)."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if fp8_path(m, x) == "torch":
        return fp8_linear_torch(x, qw, scale, groups)
    return linear_triton(x, qw, scale, groups, pdl=pdl)


@functools.cache
def blockwise_scaled_mm_available(device: torch.device) -> bool:
    """torch._scaled_mm with 1 x 128 / 128 x 128 scales runs on SM90 with cuBLASLt >= 12.9 only."""
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    return torch.cuda.get_device_capability(device)[0] == 9 and cuda >= (12, 9)


class LinearConfig(NamedTuple):
    """Launch configuration of the Triton weight-GEMM kernels (fixed per shape; see `tile_config`)."""

    block_m: int  # 1: the GEMV kernel (M = 1); else the tile kernel's columns of x (>= 16)
    block_n: int
    block_k: int  # the GEMV's K step, a multiple of the 128-column scale block (the tile kernel's is 128)
    num_warps: int
    num_stages: int
    splits: int  # programs over K; > 1: fp32 partials, summed by the last program of a tile


def tile_config(m: int, n: int, k: int, n_sm: int) -> LinearConfig:
    """The configuration for an [m, n] output over k columns, the best of a sweep on an H200 at every FP8
    shape of Flash (benchmarks/fp8_gemm.py --sweep).

    M = 1: the GEMV kernel, 16 rows and 512 columns a step, ~8 programs per SM. Larger M: the tile kernel,
    64 weight rows by the next power of two >= M (at least 16, at most 128) columns of x, ~2 programs per
    SM: more splits measured slower there (each program's partial tile costs as much as its K steps)."""
    if m == 1:
        return LinearConfig(1, 16, 512, 4, 3, k_splits(1, n, k, 16, 512, n_sm, per_sm=8))
    bm = min(128, max(16, triton.next_power_of_2(m)))
    return LinearConfig(bm, 64, BLOCK, 4, 3, k_splits(m, n, k, 64, BLOCK, n_sm, block_m=bm, per_sm=2))


def k_splits(m: int, n: int, k: int, block_n: int, block_k: int, n_sm: int, block_m: int = 1,
             per_sm: int = 8) -> int:
    """Programs over K: until there are ~per_sm programs per SM, each with at least 2 K steps, and while the
    fp32 partials (written and read once: 8 bytes an output element per split) stay under the FP8 weight's
    bytes."""
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    return max(1, min(triton.cdiv(per_sm * n_sm, tiles), triton.cdiv(k, block_k) // 2, k // (8 * m)))


def _check_fits(x2: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, groups: int, x: torch.Tensor) -> None:
    k = x2.shape[1] // groups
    n = w.shape[0]
    fits = (x2.shape[1] == groups * k and w.shape[1] == k and w.stride(1) == 1 and n % groups == 0
            and (groups == 1 or (n // groups) % 16 == 0)
            and (scale is None or scale.shape == (triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK)))
            and (scale is not None or w.dtype == x.dtype))
    if not fits:
        what = f"scale {tuple(scale.shape)}" if scale is not None else f"dtype {w.dtype} (x: {x.dtype})"
        raise ValueError(f"linear: x {tuple(x.shape)}, weight {tuple(w.shape)}, {what}, groups {groups} do not "
                         f"fit (FP8: one e8m0 scale per 128 x 128 block; bf16: the weight in x's dtype)")


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as [M, K] with a contiguous last dim."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def linear_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, groups: int = 1,
                  config: LinearConfig | None = None, pdl: bool = False, round_x: bool = False) -> torch.Tensor:
    """The Triton kernels for W in FP8 with block scales (scale given) or in x's dtype (scale None);
    config: one to use instead of `tile_config`'s (benchmarks, ops/fp8_gemm.py); pdl: launched with programmatic
    dependent launch (resolve_pdl; bitwise the same output); round_x (the GEMV, FP8 weights): x rounded to e4m3
    per 1 x 128 block of each group's columns as it is read (ops/act_quant.py), ops/fp8_gemm.py's semantics."""
    x2 = rows_of(x)
    _check_fits(x2, w, scale, groups, x)
    m, k, n = x2.shape[0], x2.shape[1] // groups, w.shape[0]
    c = config or tile_config(m, n, k, sm_count(x.device))
    if round_x and (scale is None or m != 1 or c.block_m != 1 or c.block_k % BLOCK):
        raise ValueError(f"linear: x rounded to e4m3 needs FP8 weights and the GEMV (M = 1, a K step of whole "
                         f"128-column blocks), got M = {m}, {c}")
    group_n = n // groups
    bn = c.block_n
    while groups > 1 and group_n % bn:  # a tile's columns must lie in one group
        bn //= 2
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(c.splits, m, n, dtype=torch.float32, device=x.device) if c.splits > 1 else y
    s = scale if scale is not None else w  # unused pointer when the weight has no scales
    if c.block_m == 1:  # M = 1: the GEMV kernel
        grid = (triton.cdiv(n, bn), c.splits)
        steps = triton.cdiv(triton.cdiv(k, c.block_k), c.splits)
        _gemv_kernel[grid](x2, w, s, y, part, tile_counters(x.device, grid[0]), n, k, group_n, w.stride(0),
                           s.stride(0), steps, c.splits, HAS_SCALE=scale is not None, ROUND_X=round_x,
                           BLOCK_N=bn, BLOCK_K=c.block_k, PDL=pdl, num_warps=c.num_warps,
                           num_stages=c.num_stages, launch_pdl=pdl)
    else:
        grid = (triton.cdiv(n, bn), triton.cdiv(m, c.block_m), c.splits)
        steps = triton.cdiv(triton.cdiv(k, BLOCK), c.splits)
        _tile_kernel[grid](x2, w, s, y, part, tile_counters(x.device, grid[0] * grid[1]), m, n, k, group_n,
                           x2.stride(0), w.stride(0), s.stride(0), steps, c.splits, HAS_SCALE=scale is not None,
                           BLOCK_M=c.block_m, BLOCK_N=bn,
                           PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
                           num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl)
    return y.view(*x.shape[:-1], n)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 zeros, one per output tile of a split-K launch: how many of its splits have finished. Every
    launch leaves them zero again, so one buffer per device serves every GEMM of the stream in turn.
    Allocated (or grown) at an eager call: the warm-up before any capture."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear: split-K counters must exist before CUDA-graph capture (warm up first)")
        buf = _COUNTERS[device] = torch.zeros(max(tiles, 1 << 14), dtype=torch.int32, device=device)
    return buf


_WEIGHT_SCALES: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def scaled_mm_weight_scales(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes [N/128, K/128] -> the fp32 [round_up(K/128, 4), N/128] column-major scales _scaled_mm takes,
    made once per weight (at its first, eager call) and kept while the weight lives and is unchanged."""
    hit = _WEIGHT_SCALES.get(id(scale))
    if hit is not None and hit[0]() is scale and hit[1] == scale._version:
        return hit[2]
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("linear: FP8 scales for _scaled_mm must be made before CUDA-graph capture")
    nb, kb = scale.shape
    f32 = torch.zeros(nb, triton.cdiv(kb, 4) * 4, dtype=torch.float32, device=scale.device)
    f32[:, :kb] = e8m0_scales(scale)
    key = id(scale)
    _WEIGHT_SCALES[key] = (weakref.ref(scale, lambda _: _WEIGHT_SCALES.pop(key, None)), scale._version, f32.t())
    return f32.t()


@jit
def _tile_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, GROUP_N, stride_xm, stride_wn, stride_sn,
                 STEPS, SPLITS, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 PRECISION: tl.constexpr, PDL: tl.constexpr):
    # One program: y^T tile [BLOCK_N weight rows, BLOCK_M rows of x] over K steps [split*STEPS,
    # (split+1)*STEPS) of 128 columns. The weight tile is the MMA's wide side. BLOCK_N <= 128 divides 128,
    # so a tile's rows share one scale per K step, applied to that step's fp32 product (exact: a power of
    # two). Its columns lie in one group (BLOCK_N divides GROUP_N), whose inputs are x's columns [g*K, (g+1)*K).
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x_ptr += (pid_n * BLOCK_N // GROUP_N) * K
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, 128)
    m_ok, n_ok = rm < M, rn < N
    s_row = s_ptr + (pid_n * BLOCK_N // 128) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    pdl_wait(PDL)
    for kb in range(split * STEPS, tl.minimum((split + 1) * STEPS, tl.cdiv(K, 128))):
        k_ok = (kb * 128 + rk) < K
        w = tl.load(w_ptr + rn[:, None] * stride_wn + (kb * 128 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + (kb * 128 + rk)[:, None], mask=m_ok[None, :] & k_ok[:, None],
                     other=0.0)  # x^T [128, BLOCK_M]
        if HAS_SCALE:
            sc = tl.exp2(tl.load(s_row + kb).to(tl.float32) - 127.0)
            acc += tl.dot(w.to(xt.dtype), xt, input_precision=PRECISION) * sc  # fp32 x: IEEE products, as torch
        else:
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
    pdl_trigger(PDL)
    offs = rm[None, :] * N + rn[:, None]  # y [M, N] seen as [BLOCK_N, BLOCK_M]
    store_or_sum(acc, y_ptr, part_ptr, cnt_ptr + pid_m * tl.num_programs(0) + pid_n, offs,
                  m_ok[None, :] & n_ok[:, None], split, M * N, SPLITS)


@jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, N, K, GROUP_N, stride_wn, stride_sn, STEPS, SPLITS,
                 HAS_SCALE: tl.constexpr, ROUND_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    # M = 1: rows [BLOCK_N] of y over K steps [split*STEPS, (split+1)*STEPS) of BLOCK_K columns, without
    # tl.dot (whose 16-row tiles would be 15/16 padding): products summed in an fp32 [BLOCK_N, BLOCK_K]
    # tile, reduced once at the end. The first step's weight tile is loaded before the PDL wait (no kernel of
    # a step writes weights: module doc), so its DRAM latency overlaps the end of the kernel before; that step
    # runs before the loop.
    pid_n, split = tl.program_id(0), tl.program_id(1)
    x_ptr += (pid_n * BLOCK_N // GROUP_N) * K
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    w_rows = w_ptr + rn[:, None] * stride_wn
    s_row = s_ptr + (pid_n * BLOCK_N // 128) * stride_sn
    lo = split * STEPS
    hi = tl.minimum(lo + STEPS, tl.cdiv(K, BLOCK_K))
    w_first = _weight_step(w_rows, lo, rk, n_ok, K, BLOCK_K)
    pdl_wait(PDL)
    acc = _gemv_step(tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32), w_first, x_ptr, s_row, lo, rk, K,
                     HAS_SCALE, ROUND_X, BLOCK_K)
    for kb in range(lo + 1, hi):
        acc = _gemv_step(acc, _weight_step(w_rows, kb, rk, n_ok, K, BLOCK_K), x_ptr, s_row, kb, rk, K,
                         HAS_SCALE, ROUND_X, BLOCK_K)
    pdl_trigger(PDL)
    store_or_sum(tl.sum(acc, axis=1), y_ptr, part_ptr, cnt_ptr + pid_n, rn, n_ok, split, N, SPLITS)


@jit
def _weight_step(w_rows, kb, rk, n_ok, K, BLOCK_K: tl.constexpr):
    # The GEMV's weight tile [BLOCK_N, BLOCK_K] of K step kb (rows w_rows [BLOCK_N, 1]), zeros past N and K (an
    # empty split's one step lies past K).
    kk = kb * BLOCK_K + rk
    return tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)


@jit
def _gemv_step(acc, w, x_ptr, s_row, kb, rk, K, HAS_SCALE: tl.constexpr, ROUND_X: tl.constexpr,
               BLOCK_K: tl.constexpr):
    # acc [BLOCK_N, BLOCK_K] fp32 plus weight tile w times x's columns of K step kb (zeros past K), x times the
    # block scales (s_row: the tile's 128-row block's, one per 128 columns), in fp32. ROUND_X: each 128 columns
    # of x (a multiple of them a step, counted from the group's first column) first become e4m3 values times
    # their power-of-two scale, exact in fp32, so every product is the exact product of the FP8 operands.
    kk = kb * BLOCK_K + rk
    k_ok = kk < K
    x = tl.load(x_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    if ROUND_X:  # [BLOCK_K] as [BLOCK_K / 128, 128] blocks, each rounded with its own scale
        q, sx = round_block(tl.reshape(x, (BLOCK_K // 128, 128)))
        x = tl.reshape(q.to(tl.float32) * sx[:, None], (BLOCK_K,))
    if HAS_SCALE:
        x = x * tl.exp2(tl.load(s_row + kk // 128, mask=k_ok, other=127).to(tl.float32) - 127.0)
    return acc + w.to(tl.float32) * x[None, :]


@jit
def store_or_sum(acc, y_ptr, part_ptr, cnt_ptr, offs, mask, split, PLANE, SPLITS):
    # One split: store the tile. Several: write this split's fp32 partial (through to L2), then count the
    # tile's finished splits; the last one sums all partials in split order, stores y and resets the count.
    if SPLITS == 1:
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + split * PLANE + offs, acc, mask=mask, cache_modifier=".wt")
        tl.debug_barrier()  # every thread's partial is written before the count moves
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            tot = tl.zeros(acc.shape, dtype=tl.float32)
            for s in range(SPLITS):
                tot += tl.load(part_ptr + s * PLANE + offs, mask=mask, other=0.0, cache_modifier=".cv")
            tl.store(y_ptr + offs, tot.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr, 0)
