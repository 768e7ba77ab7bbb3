"""The per-step index in one launch (Triton): every tensor of a StepIndex (ops/index.py), written
straight into the first T rows of the static index buffers.

For token t with metadata slot, pos, start_idx, start_pos, last_pos (each [T] long; `trash` the trash slot):

    ring of R rows, column j in [0, R), q = pos - R + 1 + j (the positions pos - R + 1 .. pos, oldest first):
        in_step[t, j]   = q - start_pos >= 0                           [T, R] bool
        step_row[t, j]  = max(start_idx + q - start_pos, 0)            [T, R] long
        ring_row[t, j]  = slot * R + q mod R                           [T, R] long
        valid[t, j]     = q >= 0                                       [T, R] bool
        write_row[t]    = (pos > last_pos - R ? slot : trash) * R + pos mod R    [T] long
    rotary kind k:          angles_k[t] = table_k[pos]                 [T, Dr/2] complex64 (Dr floats)
    compress ratio r:
        phase[t] = pos mod r, block[t] = pos div r, n_done[t] = (pos + 1) div r          [T] long
        emit_slot[t] = ((pos + 1) mod r == 0 ? slot : trash)                            [T] long
        cis[t] = block_table[block * r]                                [T, Dr/2] complex64

mod and div are floor-mod and floor-division (torch's `remainder`, `div(rounding_mode="floor")`), written
here so that they hold whichever way the integer `%` of the backend rounds; the rotary rows are gathered
(copied as float pairs), never computed, so every output is bitwise that of the torch twin
(ops/torch_path.py `step_index`). Positions must lie in [0, table rows): the tables cover every position a
run can reach (model/stack.py).

One program per token (grid (T,)): its five metadata values, then each ring's row of R columns as one tile,
each rotary row, each ratio's scalars and rotary row. Ring lengths, ratios, rotary width and the output
tensors (tuples of tensors, one tuple per ring and per ratio) are fixed for a stack, so the configuration is
fixed per shape and nothing is read on the host: capturable in a CUDA graph.

PDL (ops/kernel_support.py): the wait precedes the metadata loads (the step's metadata buffers, written by
the copy before it), the trigger follows them; the rotary tables are written once, when the stack is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tp_runtime.ops.kernel_support import jit, pdl_trigger, pdl_wait, tl, triton


@jit
def _floor_mod(x, m):
    """x mod m in [0, m) for m > 0, whether `%` truncates (CUDA) or floors."""
    r = x % m
    return tl.where(r < 0, r + m, r)


@jit
def _floor_div(x, m):
    """floor(x / m) for m > 0: (x - x mod m) / m divides exactly, so either rounding of `//` gives it."""
    return (x - _floor_mod(x, m)) // m


@jit
def _ring_row(out, t, slot, pos, sidx, spos, last, trash, R: tl.constexpr, BLOCK: tl.constexpr):
    """Token t's row of one ring of R rows: out = (in_step, step_row, ring_row, valid, write_row)."""
    j = tl.arange(0, BLOCK)
    jm = j < R
    q = pos - (R - 1) + j  # [BLOCK] positions, oldest first
    rel = q - spos
    row = t * R + j
    tl.store(out[0] + row, rel >= 0, mask=jm)
    tl.store(out[1] + row, tl.maximum(sidx + rel, 0), mask=jm)
    tl.store(out[2] + row, slot * R + _floor_mod(q, R), mask=jm)
    tl.store(out[3] + row, q >= 0, mask=jm)
    keep = tl.where(pos > last - R, slot, trash)
    tl.store(out[4] + t, keep * R + _floor_mod(pos, R))


@jit
def _rotary_row(table, out, t, p, DR: tl.constexpr, BLOCK_DR: tl.constexpr):
    """Row p of a rotary table (DR floats: Dr/2 complex pairs) into row t of out."""
    d = tl.arange(0, BLOCK_DR)
    dm = d < DR
    tl.store(out + t * DR + d, tl.load(table + p * DR + d, mask=dm), mask=dm)


@jit
def _block_row(out, t, slot, pos, trash, block_table, r: tl.constexpr, DR: tl.constexpr, BLOCK_DR: tl.constexpr):
    """Token t's compressed block for ratio r: out = (phase, block, emit_slot, n_done, angles at block * r)."""
    block = _floor_div(pos, r)
    tl.store(out[0] + t, _floor_mod(pos, r))
    tl.store(out[1] + t, block)
    tl.store(out[2] + t, tl.where(_floor_mod(pos + 1, r) == 0, slot, trash))
    tl.store(out[3] + t, _floor_div(pos + 1, r))
    _rotary_row(block_table, out[4], t, block * r, DR, BLOCK_DR)


@jit
def _step_index_kernel(slot_ptr, pos_ptr, sidx_ptr, spos_ptr, last_ptr, trash, rings, RS: tl.constexpr,
                       RBLOCKS: tl.constexpr, tables, angles, blocks, RATIOS: tl.constexpr, block_table,
                       DR: tl.constexpr, BLOCK_DR: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    sidx = tl.load(sidx_ptr + t)
    spos = tl.load(spos_ptr + t)
    last = tl.load(last_ptr + t)
    pdl_trigger(PDL)
    for i in tl.static_range(len(RS)):
        _ring_row(rings[i], t, slot, pos, sidx, spos, last, trash, RS[i], RBLOCKS[i])
    for k in tl.static_range(len(angles)):
        _rotary_row(tables[k], angles[k], t, pos, DR, BLOCK_DR)
    for i in tl.static_range(len(RATIOS)):
        _block_row(blocks[i], t, slot, pos, trash, block_table, RATIOS[i], DR, BLOCK_DR)


def _rows(t: torch.Tensor, n: int, cols: int | None = None) -> bool:
    """t is contiguous [N >= n, cols], or [N >= n] when cols is None."""
    shape_ok = t.dim() == 1 if cols is None else t.shape[1:] == (cols,)
    return t.is_contiguous() and shape_ok and t.shape[0] >= n


def _floats(cis: torch.Tensor, n: int, dr: int) -> torch.Tensor:
    """A complex64 [N >= n, Dr/2] rotary tensor as its float pairs, [N, Dr] float32."""
    if not (cis.dtype == torch.complex64 and _rows(cis, n, dr // 2)):
        raise ValueError(f"step_index: rotary rows must be contiguous complex64 [N >= {n}, {dr // 2}], got "
                         f"{cis.dtype} {tuple(cis.shape)}")
    return torch.view_as_real(cis).flatten(1)


RING_DTYPES = (torch.bool, torch.long, torch.long, torch.bool, torch.long)  # a RingIndex's fields


def _check(T: int, meta: Sequence[torch.Tensor], rings: Mapping[int, Sequence[torch.Tensor]],
           blocks: Mapping[int, Sequence[torch.Tensor]]) -> None:
    """ValueError unless the metadata are contiguous [T] long rows and the integer outputs hold T rows of
    their fields' dtypes (the kernel stores bytes of those types)."""
    if not all(m.shape == (T,) and m.is_contiguous() and m.dtype == torch.long for m in meta):
        raise ValueError(f"step_index: metadata rows must be contiguous [{T}] long")
    for R, out in rings.items():
        if not (all(_rows(o, T, R) for o in out[:4]) and _rows(out[4], T)
                and tuple(o.dtype for o in out) == RING_DTYPES):
            raise ValueError(f"step_index: ring {R}'s outputs must be contiguous [N >= {T}, {R}] (bool, long, long, "
                             f"bool) and [N >= {T}] long")
    if not all(_rows(o, T) and o.dtype == torch.long for out in blocks.values() for o in out[:4]):
        raise ValueError(f"step_index: block outputs must be contiguous [N >= {T}] long")


def step_index(slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
               last_pos: torch.Tensor, trash: int, rings: Mapping[int, Sequence[torch.Tensor]],
               angles: Sequence[tuple[torch.Tensor, torch.Tensor]], blocks: Mapping[int, Sequence[torch.Tensor]],
               block_table: torch.Tensor | None, pdl: bool = False) -> None:
    """The step index of T = len(pos) tokens into the first T rows of its buffers, in one launch.

    slot .. last_pos: [T] long, contiguous. rings: R -> (in_step, step_row, ring_row, valid, write_row), rows
    [N >= T, R] (bool, long, long, bool) and [N] long. angles: (table [P, Dr/2], out [N, Dr/2]) complex64 per
    rotary kind. blocks: r -> (phase, block, emit_slot, n_done [N] long, cis [N, Dr/2] complex64), their
    angles from block_table [P, Dr/2] (None only without blocks). Every tensor contiguous, on pos's device.
    pdl: launch with programmatic dependent launch (resolve_pdl; bitwise the same output).
    """
    T = pos.shape[0]
    _check(T, (slot, pos, start_idx, start_pos, last_pos), rings, blocks)
    if T == 0:
        return
    tables = [table for table, _ in angles] + ([block_table] if blocks else [])
    dr = 2 * tables[0].shape[-1] if tables else 2
    _step_index_kernel[(T,)](
        slot, pos, start_idx, start_pos, last_pos, trash,
        tuple(tuple(out) for out in rings.values()), RS=tuple(rings),
        RBLOCKS=tuple(triton.next_power_of_2(R) for R in rings),
        tables=tuple(_floats(table, 0, dr) for table, _ in angles),
        angles=tuple(_floats(out, T, dr) for _, out in angles),
        blocks=tuple((*out[:4], _floats(out[4], T, dr)) for out in blocks.values()), RATIOS=tuple(blocks),
        block_table=_floats(block_table, 0, dr) if blocks else pos,
        DR=dr, BLOCK_DR=triton.next_power_of_2(dr), PDL=pdl, num_warps=_warps(rings), launch_pdl=pdl)


def _warps(rings: Mapping[int, Sequence[torch.Tensor]]) -> int:
    """One warp per 128 columns of the widest ring (a Flash window row: 128 longs, 4 per thread), up to 4."""
    return max(1, min(4, max(rings, default=1) // 128))
