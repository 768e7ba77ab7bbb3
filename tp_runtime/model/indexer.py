"""Lightning indexer of ratio-4 (CSA) layers: picks the top-K compressed entries each token attends to.

Replicated on every rank (no collective). Stage A (the head weights and its own ratio-4 compressor's
inputs, projected from x) is part of the layer's fused x GEMM (attention.x_projections); stage B projects
the indexer query from qr (the layer rotates it together with its own q and kv, at the same angles),
lets the compressor emit keys, scores every valid entry and selects the top K.
The reference's Hadamard rotation and FP4 simulation cancel or vanish in exact arithmetic and are skipped
(spec section 3, step 8). With FP8 caches the keys are stored as e4m3 with one fp32 scale each and the
scores read them so (the rounded keys), as the released model does.
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.config import ModelConfig
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.cache import LayerCache
from tp_runtime.model.compressor import Compressor
from tp_runtime.model.layers import ReplicatedLinear
from tp_runtime.ops.indexer_topk import indexer_topk as triton_indexer_topk
from tp_runtime.ops.torch_path import indexer_topk


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, kernels: str = "torch",
                 fp8: bool = False):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.wq_b = ReplicatedLinear(cfg.q_lora_rank, self.n_heads * self.head_dim, dtype, device, fp8)
        self.compressor = Compressor(4, self.head_dim, cfg.rms_norm_eps, dtype, device, kernels, store="key")
        # Scores and top-K (ops/select.py): torch_path's or the Triton kernels'; same signature and meaning.
        self._topk = triton_indexer_topk if kernels == "triton" else indexer_topk

    def query(self, qr: torch.Tensor) -> torch.Tensor:
        """Stage B: the query before rotary, qr [T, Rq] -> [T, Ih, Id] (a fresh buffer; the layer's
        prepare rotates it by cis["compressed"], in place on the triton path)."""
        return self.wq_b(qr).view(len(qr), self.n_heads, self.head_dim)

    def prepare(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, cache: LayerCache) -> None:
        """Stage B, device metadata only: emit this step's keys into cache.index_keys."""
        self.compressor(kv, score, b, cache.index_state, cache.index_keys)

    def select(self, q: torch.Tensor, w: torch.Tensor, b: StepBatch, cache: LayerCache) -> torch.Tensor:
        """Stage B, host metadata: the chosen entries [n, min(K, N)] of the n real tokens, -1 where none."""
        n = b.n_tokens
        n_keys = (b.max_pos + 1) // 4  # entries any token of this step may see (host bound)
        return self._topk(q[:n], w[:n], cache.index_keys, b.slot[:n], b.ix.blocks[4].n_done[:n], n_keys, self.topk)
