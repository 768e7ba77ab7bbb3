"""Gated pooling compressor: every r tokens of a sequence become one compressed KV row.

Stage A, its two projections of x (kv and gate scores, in the GEMM's dtype), is part of the layer's fused
x GEMM (attention.x_projections). Stage B (`forward`) adds the positional bias ape[pos % r] to the scores,
pools each block that a token of this step completes, normalizes, ropes at position i*r and stores row i;
then keeps the newest c*r tokens as state. With r = 4 (c = 2) blocks overlap: entry i softmaxes per channel
over block i-1's tokens (channels [0, D)) and block i's tokens (channels [D, 2D)); block -1 counts as
score -inf. All of it is fp32 math; entries are rounded once, into the cache's dtype, or with FP8 caches
(a uint8 `out`) quantized from fp32 into the layout of `store`: "row" (attention rows, e4m3 nope + bf16
rope) for the layer's compressor, "key" (e4m3 codes, and one fp32 scale a key into a tensor of its own) for
the indexer's (ops/cache_fp8.py).
The kernels are the backend's `compress`: ops/torch_path.py `compress_pool` (the semantics) or the two
Triton launches of ops/compressor_pool.py.
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.model.batch import StepBatch
from tp_runtime.model.layers import RMSNorm
from tp_runtime.ops.index import RingState, ring_length
from tp_runtime.ops.select import KernelBackend


class Compressor(nn.Module):
    def __init__(self, ratio: int, head_dim: int, eps: float, dtype: torch.dtype, device: torch.device,
                 backend: KernelBackend, store: str = "row"):
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
        self.norm = RMSNorm(head_dim, eps, dtype, device, backend)  # its weight and eps; applied inside compress
        self.backend = backend

    def forward(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, state: RingState,
                out: torch.Tensor, scales: torch.Tensor | None = None) -> None:
        """Stage B: kv, score [T, c*D] (stage A's projections, any float dtype) -> the entries completed
        in this step into out [slots+1, N, D] (uint8 [slots+1, N, bytes]: FP8 entries; FP8 keys: their e4m3
        codes [slots+1, N, D], and their fp32 scales into scales [slots+1, N]); update state."""
        blk, ring = b.ix.blocks[self.ratio], b.ix.rings[ring_length(self.ratio)]
        store = self.store if out.dtype == torch.uint8 else "plain"
        self.backend.compress(kv, score, self.ape, self.norm.weight, self.norm.eps, blk, ring, state, out, store,
                              scales)
