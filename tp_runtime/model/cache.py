"""Per-layer caches of one rank, indexed by sequence slot, and the pool of free slots.

Every cache has one spare slot at the end, the trash slot: writes that must not land (padding
tokens, ring rows a later token of the chunk supersedes, entries no block completes) go there,
so device code needs no host-side selection and stays capturable.

DSV4 attention has a single shared KV row per token (K = V), so caches are not split by heads:
every rank of the TP group holds the same caches. Layout per slot and layer:
window ring [W, D]; compressed rows [ceil(max_len / r), D]; compressor state ring [c*r, c*D] of kv
and gated score (fp32); for r = 4 also indexer keys [ceil(max_len / 4), Id] and their own state.
With FP8 caches (runtime.cache_format=fp8) the window ring and the compressed rows are uint8 rows of
row_bytes(D, Dr) (592 at Flash dims), and the indexer keys two tensors: their e4m3 codes, uint8
[ceil(max_len / 4), Id], and one fp32 power-of-two scale a key, index_scales [ceil(max_len / 4)]
(key_bytes(Id) = Id + 4 bytes a key in all, 132 at Flash dims): ops/cache_fp8.py.
The state rings stay fp32 either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.config import ModelConfig, compressed_len
from tp_runtime.ops.cache_fp8 import key_bytes, quantize_keys, quantize_rows, row_bytes
from tp_runtime.ops.index import RingState, ring_length


@dataclass
class LayerCache:
    window: torch.Tensor  # [slots, W, D], row = pos % W
    compressed: torch.Tensor | None = None  # [slots, ceil(max_len / r), D], row = block index
    comp_state: RingState | None = None
    index_keys: torch.Tensor | None = None  # [slots, ceil(max_len / 4), Id] (FP8: uint8 e4m3 codes)
    index_scales: torch.Tensor | None = None  # FP8 caches: [slots, ceil(max_len / 4)] fp32, each key's scale
    index_state: RingState | None = None
    dim: int = 0  # D of an attention row (as computed; FP8 rows store it in more bytes)
    rope_dim: int = 0  # Dr, the bf16 tail of an FP8 row
    index_dim: int = 0  # Id of an indexer key

    @property
    def fp8(self) -> bool:
        return self.window.dtype == torch.uint8

    def stored_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Attention rows x [..., D] as window / compressed store them (FP8 bytes, or the cache dtype)."""
        return quantize_rows(x, self.rope_dim) if self.fp8 else x.to(self.window.dtype)

    def stored_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Indexer keys x [..., Id] as index_keys and index_scales store them: FP8 caches (e4m3 codes uint8
        [..., Id], scales fp32 [...]), else (x in the cache dtype, None)."""
        return quantize_keys(x) if self.fp8 else (x.to(self.index_keys.dtype), None)

    def tensors(self) -> list[torch.Tensor]:
        out = [self.window, self.compressed, self.index_keys, self.index_scales]
        for st in (self.comp_state, self.index_state):
            if st is not None:
                out += [st.kv, st.score]
        return [t for t in out if t is not None]

    def clear(self, slots: slice) -> None:
        """Zero these slots of every tensor."""
        for t in self.tensors():
            t[slots].zero_()


def row_widths(cfg: ModelConfig, fp8: bool) -> tuple[int, int]:
    """Sizes of an attention row and of an indexer key as stored: bytes with FP8 caches (a key's Id code bytes
    in index_keys and its 4-byte scale in index_scales together), else elements (the tensors' last dims)."""
    if fp8:
        return row_bytes(cfg.head_dim, cfg.qk_rope_head_dim), key_bytes(cfg.index_head_dim)
    return cfg.head_dim, cfg.index_head_dim


def allocate_layer_cache(cfg: ModelConfig, ratio: int, slots: int, max_len: int, dtype: torch.dtype,
                         device: torch.device, fp8: bool = False) -> LayerCache:
    """Caches with slots + 1 rows: the last is the trash slot that padding and discarded writes use.
    fp8: the released byte layouts (uint8) for window and compressed rows, and the indexer keys' e4m3 codes
    (uint8) with their fp32 scales in index_scales."""
    D, slots = cfg.head_dim, slots + 1
    row, _ = row_widths(cfg, fp8)
    dt = torch.uint8 if fp8 else dtype
    cache = LayerCache(window=torch.zeros(slots, cfg.sliding_window, row, dtype=dt, device=device),
                       dim=D, rope_dim=cfg.qk_rope_head_dim, index_dim=cfg.index_head_dim)
    if ratio:
        cache.compressed = torch.zeros(slots, compressed_len(max_len, ratio), row, dtype=dt, device=device)
        cache.comp_state = RingState.empty(slots, ratio, D, device, dtype)
    if ratio == 4:
        Id, n = cfg.index_head_dim, compressed_len(max_len, 4)
        cache.index_keys = torch.zeros(slots, n, Id, dtype=dt, device=device)
        if fp8:
            cache.index_scales = torch.zeros(slots, n, dtype=torch.float32, device=device)
        cache.index_state = RingState.empty(slots, 4, Id, device, dtype)
    return cache


def cache_bytes(cfg: ModelConfig, ratios: list[int], slots: int, max_len: int, elem: int, fp8: bool) -> int:
    """Bytes allocate_layer_cache holds for these layers (slots + the trash slot, every tensor, state rings
    fp32, float64 in a float64 run): the memory a rank's caches take, from the stored layout (elem: bytes of
    the run dtype)."""
    row, key = row_widths(cfg, fp8)
    row_b, key_b = (row, key) if fp8 else (row * elem, key * elem)
    state = max(elem, 4)  # bytes of a state ring's element (RingState.empty)
    total = 0
    for r in ratios:
        n = cfg.sliding_window * row_b
        if r:
            R = ring_length(r)
            n += compressed_len(max_len, r) * row_b + 2 * R * (R // r) * cfg.head_dim * state
        if r == 4:
            n += compressed_len(max_len, 4) * key_b + 2 * 8 * 2 * cfg.index_head_dim * state
        total += n
    return total * (slots + 1)
