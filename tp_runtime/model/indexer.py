"""Lightning indexer of ratio-4 (CSA) layers: picks the top-K compressed entries each token attends to.

Replicated on every rank (no collective). Stage A (the head weights and its own ratio-4 compressor's
inputs, projected from x) is part of the layer's fused x GEMM (attention.x_projections). Stage B projects
the indexer query from qr (rotated at the layer's "compressed" angles, with the layer's q and kv or on
its own branch: DSV4Attention.stage_b), lets the compressor emit keys, scores every valid entry and
selects the top K. The reference's Hadamard rotation of query and keys cancels in their dot product, and
its FP4 simulation vanishes in exact arithmetic: both are skipped. With FP8 caches the keys are stored as
e4m3 codes (cache.index_keys) with one fp32 scale each (cache.index_scales) and the scores read them so (the
rounded keys), as the released model does.
With runtime.indexer_q=e4m3 the scores also round each head's query the same way (FP8 keys: an FP8 dot), as
DeepSeek's and vLLM's indexers do.
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.config import ModelConfig
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.cache import LayerCache
from tp_runtime.model.compressor import Compressor
from tp_runtime.model.layers import ReplicatedLinear, RMSNorm
from tp_runtime.ops.act_quant import RoundedX
from tp_runtime.ops.select import KernelBackend


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, backend: KernelBackend,
                 fp8: bool = False):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.wq_b = ReplicatedLinear(cfg.q_lora_rank, self.n_heads * self.head_dim, dtype, device, backend, fp8)
        self.compressor = Compressor(4, self.head_dim, cfg.rms_norm_eps, dtype, device, backend, store="key")
        self.backend = backend
        self.q_fp8 = False  # runtime.indexer_q=e4m3: scores of q rounded to e4m3 per head (set by AttentionStack)

    def query(self, qr: torch.Tensor, qr_norm: RMSNorm | None = None, rounded: RoundedX | None = None
              ) -> torch.Tensor:
        """The query before rotary, qr [T, Rq] (through qr_norm first, if given; rounded: qr's e4m3 rounding,
        made ahead) -> [T, Ih, Id]: a fresh buffer, which the Triton backend rotates in place."""
        return self.wq_b(qr, qr_norm, rounded).view(len(qr), self.n_heads, self.head_dim)

    def prepare(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, cache: LayerCache) -> None:
        """Device metadata only: emit this step's keys into cache.index_keys (FP8: and cache.index_scales)."""
        self.compressor(kv, score, b, cache.index_state, cache.index_keys, cache.index_scales)

    def select(self, q: torch.Tensor, w: torch.Tensor, b: StepBatch, cache: LayerCache) -> torch.Tensor:
        """Host metadata: the chosen entries [n, min(K, N)] of the n real tokens, -1 where none (q roped)."""
        n = b.n_tokens
        n_keys = (b.max_pos + 1) // 4  # entries any token of this step may see (host bound)
        return self.backend.indexer_topk(q[:n], w[:n], cache.index_keys, b.slot[:n], b.ix.blocks[4].n_done[:n],
                                         n_keys, self.topk, q_fp8=self.q_fp8, key_scales=cache.index_scales)
