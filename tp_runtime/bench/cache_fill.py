"""Caches of B consecutive slots holding a context of c tokens, built two ways for decode benchmarks.

`fill_seeded` writes, without running the model, every row a prefill of positions 0..c-1 leaves behind,
at the same places: window ring rows pos % W for the last min(W, c) positions; compressed rows
0..c//r - 1; indexer keys 0..c//4 - 1; compressor (and indexer-compressor) state ring rows pos % R for
the last min(R, c) positions (R = c_factor * r). Values are seeded standard-normal rows, the scale
of what a prefill stores (RMS-normed cache rows, unit-scale projections). Everything else in those slots
is zeroed first, so the written rows are exactly the occupied ones. Every rank draws the same values.
FP8 caches get the same draws, quantized into their layout (LayerCache.stored_rows; stored_keys: the keys'
e4m3 codes into index_keys, their scales into index_scales).

`fill_by_prefill` runs the real prefill (chunked, one sequence per step) on the seeded inputs the
workload generator gives request = slot.
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch

from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.worker import Worker
from tp_runtime.engine.workload import Workload
from tp_runtime.model.cache import LayerCache
from tp_runtime.ops.index import RingState


def _generator(seed: int, layer: int, what: str, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + layer * 7919 + zlib.crc32(what.encode()))
                                                     % (2**63))


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _ring_write(ring: torch.Tensor, slots: slice, context: int, g: torch.Generator, dim: int | None = None,
                store: Callable[[torch.Tensor], torch.Tensor] = _identity) -> None:
    """ring [slots, R, C]: rows of positions max(0, c - R) .. c - 1 at index pos % R; rows of `dim` values
    (default C) drawn, then stored as `store` makes them (FP8 bytes)."""
    n_rows, batch = ring.shape[1], slots.stop - slots.start
    idx = torch.arange(max(0, context - n_rows), context, device=ring.device).remainder(n_rows)
    dt = torch.float32 if ring.dtype == torch.uint8 else ring.dtype
    vals = torch.randn(batch, idx.numel(), dim or ring.shape[2], generator=g, device=ring.device, dtype=dt)
    ring[slots, idx] = store(vals)


def _prefix_write(rows: torch.Tensor, slots: slice, n: int, g: torch.Generator, dim: int | None = None,
                  store: Callable[[torch.Tensor], torch.Tensor] = _identity) -> None:
    """rows [slots, N, C]: entries 0..n-1 (completed compressed blocks)."""
    batch = slots.stop - slots.start
    dt = torch.float32 if rows.dtype == torch.uint8 else rows.dtype
    rows[slots, :n] = store(torch.randn(batch, n, dim or rows.shape[2], generator=g, device=rows.device, dtype=dt))


def _key_prefix_write(cache: LayerCache, slots: slice, n: int, g: torch.Generator) -> None:
    """Indexer keys 0..n-1 (completed blocks): Id values drawn (as _prefix_write draws rows), stored as
    cache.stored_keys makes them into index_keys [slots, N, Id] and, with FP8 caches, index_scales [slots, N]."""
    batch = slots.stop - slots.start
    dt = torch.float32 if cache.fp8 else cache.index_keys.dtype
    keys = torch.randn(batch, n, cache.index_dim, generator=g, device=cache.index_keys.device, dtype=dt)
    codes, scales = cache.stored_keys(keys)
    cache.index_keys[slots, :n] = codes
    if scales is not None:
        cache.index_scales[slots, :n] = scales


def _state_write(state: RingState, slots: slice, context: int, g: torch.Generator) -> None:
    _ring_write(state.kv, slots, context, g)
    _ring_write(state.score, slots, context, g)


@torch.no_grad()
def fill_seeded(caches: list[LayerCache], ratios: list[int], batch: int, context: int, seed: int,
                first_slot: int = 0) -> None:
    """Slots first_slot .. first_slot + batch - 1 of every layer cache as a prefill of `context` tokens
    leaves them (seeded values)."""
    slots = slice(first_slot, first_slot + batch)
    if len(caches) != len(ratios):
        raise ValueError(f"{len(caches)} caches but {len(ratios)} compress ratios")
    for layer, (cache, r) in enumerate(zip(caches, ratios)):
        need = -(-context // r) if r else 0
        if cache.compressed is not None and need > cache.compressed.shape[1]:
            raise ValueError(f"context {context} needs {need} compressed rows; the cache holds "
                             f"{cache.compressed.shape[1]} (runtime.max_len too small)")
        if slots.stop > cache.window.shape[0] - 1:  # the last slot is the trash slot
            raise ValueError(f"slots {slots.start}..{slots.stop - 1} exceed the {cache.window.shape[0] - 1} "
                             "cache slots")
        cache.clear(slots)
        g = _generator(seed, layer, "window", cache.window.device)
        _ring_write(cache.window, slots, context, g, cache.dim, cache.stored_rows)
        if r:
            _prefix_write(cache.compressed, slots, context // r, g, cache.dim, cache.stored_rows)
            _state_write(cache.comp_state, slots, context, g)
        if r == 4:
            _key_prefix_write(cache, slots, context // 4, g)
            _state_write(cache.index_state, slots, context, g)


def prefill_plans(batch: int, context: int, chunk: int, first_slot: int = 0) -> list[StepPlan]:
    """Chunked prefill of positions 0..context-1 for slots first_slot.. first_slot + batch - 1 (request
    id = slot), one chunk a step."""
    return [StepPlan((SeqChunk(slot, slot, start, min(chunk, context - start), False),))
            for slot in range(first_slot, first_slot + batch) for start in range(0, context, chunk)]


@torch.no_grad()
def fill_by_prefill(worker: Worker, batch: int, context: int, chunk: int, seed: int, first_slot: int = 0) -> int:
    """Clear slots first_slot .. first_slot + batch - 1 and prefill them to `context` tokens with the real
    model; returns steps run."""
    for cache in worker.caches:
        cache.clear(slice(first_slot, first_slot + batch))
    workload = Workload([], worker.cfg.model.hidden_size, seed)
    plans = prefill_plans(batch, context, chunk, first_slot)
    for plan in plans:
        worker.step(plan, workload.step_inputs(plan, worker.device, worker.dtype))
    return len(plans)
