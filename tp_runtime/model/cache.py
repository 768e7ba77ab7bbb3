"""Per-layer caches of one rank, indexed by sequence slot, and the pool of free slots.

Every cache has one spare slot at the end, the trash slot: writes that must not land (padding
tokens, ring rows a later token of the chunk supersedes, entries no block completes) go there,
so device code needs no host-side selection and stays capturable.

DSV4 attention has a single shared KV row per token (K = V), so caches are not split by heads:
every rank of the TP group holds the same caches. Layout per slot and layer (spec section 4):
window ring [W, D]; compressed rows [ceil(max_len / r), D]; compressor state ring [c*r, c*D] of kv
and gated score (fp32); for r = 4 also indexer keys [ceil(max_len / 4), Id] and their own state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.config import ModelConfig, compressed_len


def ring_length(ratio: int) -> int:
    """Rows of a compressor's state ring: c*r tokens (c = 2 for the overlapping ratio-4 compressor)."""
    return (2 if ratio == 4 else 1) * ratio


@dataclass
class RingState:
    """The last c*r tokens' compressor inputs: kv [slots, c*r, c*D] and score (+ape) of the same shape."""

    kv: torch.Tensor
    score: torch.Tensor

    @classmethod
    def empty(cls, slots: int, ratio: int, dim: int, device: torch.device) -> "RingState":
        rows = ring_length(ratio)
        shape = (slots, rows, rows // ratio * dim)
        return cls(torch.zeros(shape, dtype=torch.float32, device=device),
                   torch.zeros(shape, dtype=torch.float32, device=device))


@dataclass
class LayerCache:
    window: torch.Tensor  # [slots, W, D], row = pos % W
    compressed: torch.Tensor | None = None  # [slots, ceil(max_len / r), D], row = block index
    comp_state: RingState | None = None
    index_keys: torch.Tensor | None = None  # [slots, ceil(max_len / 4), Id]
    index_state: RingState | None = None

    def tensors(self) -> list[torch.Tensor]:
        out = [self.window, self.compressed, self.index_keys]
        for st in (self.comp_state, self.index_state):
            if st is not None:
                out += [st.kv, st.score]
        return [t for t in out if t is not None]

    def clear(self, slots: slice) -> None:
        """Zero these slots of every tensor."""
        for t in self.tensors():
            t[slots].zero_()


def allocate_layer_cache(cfg: ModelConfig, ratio: int, slots: int, max_len: int, dtype: torch.dtype,
                         device: torch.device) -> LayerCache:
    """Caches with slots + 1 rows: the last is the trash slot that padding and discarded writes use."""
    D, slots = cfg.head_dim, slots + 1
    cache = LayerCache(window=torch.zeros(slots, cfg.sliding_window, D, dtype=dtype, device=device))
    if ratio:
        cache.compressed = torch.zeros(slots, compressed_len(max_len, ratio), D, dtype=dtype, device=device)
        cache.comp_state = RingState.empty(slots, ratio, D, device)
    if ratio == 4:
        Id = cfg.index_head_dim
        cache.index_keys = torch.zeros(slots, compressed_len(max_len, 4), Id, dtype=dtype, device=device)
        cache.index_state = RingState.empty(slots, 4, Id, device)
    return cache
