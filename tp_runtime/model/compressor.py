"""Gated pooling compressor: every r tokens of a sequence become one compressed KV row.

Stage A, its two projections of x (kv and gate scores, in the GEMM's dtype), is part of the layer's fused
x GEMM (attention.x_projections). Stage B (`forward`) adds the
positional bias ape[pos % r] to the scores, pools each block that a token of this step completes,
normalizes, ropes at position i*r and stores row i; then keeps the newest c*r tokens as state.
With r = 4 (c = 2) blocks overlap: entry i softmaxes per channel over block i-1's tokens
(channels [0, D)) and block i's tokens (channels [D, 2D)); block -1 counts as score -inf.
All of it is fp32 math; entries are rounded once, into the cache's dtype, or with FP8 caches (a uint8
`out`) quantized from fp32 into the layout of `store`: "row" (attention rows, e4m3 nope + bf16 rope) for
the layer's compressor, "key" (e4m3 + one fp32 scale) for the indexer's (ops/cache_fp8.py).
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.model.batch import StepBatch
from tp_runtime.model.cache import RingState, ring_length
from tp_runtime.model.layers import RMSNorm, rms_norm
from tp_runtime.model.rope import apply_rotary
from tp_runtime.model.step_index import BlockIndex, RingIndex
from tp_runtime.ops.cache_fp8 import quantize_keys, quantize_rows
from tp_runtime.ops.compressor_pool import compress_pool
from tp_runtime.ops.torch_path import gather_rows, token_chunks, write_ring


class Compressor(nn.Module):
    def __init__(self, ratio: int, head_dim: int, eps: float, dtype: torch.dtype, device: torch.device,
                 kernels: str = "torch", store: str = "row"):
        """store: the FP8 layout of the entries, "row" (attention rows) or "key" (indexer keys); used when
        the cache handed to forward is uint8."""
        super().__init__()
        assert ratio in (4, 128), f"compress ratio {ratio} not in (4, 128)"
        assert store in ("row", "key"), store
        self.ratio, self.head_dim, self.store = ratio, head_dim, store
        self.overlap = ratio == 4
        c = 2 if self.overlap else 1
        self.ape = nn.Parameter(torch.empty(ratio, c * head_dim, dtype=torch.float32, device=device),
                                requires_grad=False)
        self.norm = RMSNorm(head_dim, eps, dtype, device)
        # Stage B (ops/select.py): compress_torch or the fused kernels (two launches); same signature and meaning.
        self._stage_b = compress_pool if kernels == "triton" else compress_torch

    def forward(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, state: RingState,
                out: torch.Tensor) -> None:
        """Stage B: kv, score [T, c*D] (stage A's projections, any float dtype) -> the entries completed
        in this step into out [slots+1, N, D] (uint8 [slots+1, N, bytes]: FP8 entries); update state."""
        blk, ring = b.ix.blocks[self.ratio], b.ix.rings[ring_length(self.ratio)]
        store = self.store if out.dtype == torch.uint8 else "plain"
        self._stage_b(kv, score, self.ape, self.norm.weight, self.norm.eps, blk, ring, state, out, store)


def compress_torch(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, weight: torch.Tensor, eps: float,
                   blk: BlockIndex, ring: RingIndex, state: RingState, out: torch.Tensor, store: str = "plain") -> None:
    """Stage B on the torch path. kv, score [T, C] (C = c*D); ape [r, C] fp32; weight [D]; blk, ring: the
    BlockIndex of ratio r and the RingIndex of c*r rows; state rings [slots+1, c*r, C]; out [slots+1, N, D];
    store: "plain" (entries in out's dtype), "row" or "key" (FP8 bytes of the layout into a uint8 out).

    Every token of the step is pooled as if it completed a block; the entries of tokens that
    do not (and of padding) land in the trash slot. That keeps this free of host decisions,
    hence capturable, at the price of pooling work for the tokens that complete nothing.
    """
    kv, score = kv.float(), score.float() + ape[blk.phase]
    for s, e in token_chunks(len(score), state.kv.shape[1] * state.kv.shape[2]):
        pooled = _pool(kv, score, state, ring.tokens(s, e), ape.shape[0], weight.shape[0])
        entries = apply_rotary(rms_norm(pooled, weight, eps), blk.cis[s:e])
        out[blk.emit_slot[s:e], blk.block[s:e]] = _stored(entries, store, 2 * blk.cis.shape[-1], out.dtype)
    write_ring(state.kv, kv, ring)  # after pooling: it read the ring's older rows
    write_ring(state.score, score, ring)


def _stored(entries: torch.Tensor, store: str, rope_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """fp32 entries [E, D] as the cache stores them: in its dtype, or FP8 rows / keys (uint8)."""
    if store == "row":
        return quantize_rows(entries, rope_dim)
    if store == "key":
        return quantize_keys(entries)
    return entries.to(dtype)


def _pool(kv: torch.Tensor, score: torch.Tensor, state: RingState, ix: RingIndex, r: int, D: int) -> torch.Tensor:
    """Softmax-weighted sum per channel over the c*r tokens ending at each token of ix -> [E, D] fp32."""
    rows = gather_rows(kv, state.kv, ix)  # [E, c*r, c*D], oldest first
    gates = gather_rows(score, state.score, ix)
    if rows.shape[-1] == 2 * D:  # overlap: previous block contributes channels [0, D), current block [D, 2D)
        rows = torch.cat((rows[:, :r, :D], rows[:, r:, D:]), dim=1)
        gates = torch.cat((gates[:, :r, :D], gates[:, r:, D:]), dim=1)
    gates = gates.masked_fill(~ix.valid[..., None], float("-inf"))
    return (gates.softmax(dim=1) * rows).sum(dim=1)
