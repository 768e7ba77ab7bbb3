"""FLOPs one rank computes for a prefill chunk: the model behind the bench's prefill TFLOP/s.

A chunk of n tokens of one sequence sits at positions ctx .. ctx + n - 1 (ctx: tokens already in its cache).
Per token at position p and per selected layer of compress ratio r, on a rank of tp (Hl = H / tp heads here):

    weights    2 x P_r                       P_r: the rank's GEMM weight parameters of the layer (the shard
                                             table's matrices: wq_a + wkv, wq_b / tp, wo_a / tp, wo_b / tp; r > 0
                                             the compressor's wkv + wgate; r = 4 the indexer's wq_b, weights_proj
                                             and its compressor's wkv + wgate): one multiply-add each
    attention  2 x 2 x Hl x D x rows(p)      the QK and PV dots of every local head over the token's candidates:
                                             rows(p) = min(W, p + 1) window rows, + min(K, (p + 1) // 4) picked
                                             rows (r = 4) or + (p + 1) // 128 compressed rows (r = 128)
    indexer    2 x Ih x Id x (p + 1) // 4    (r = 4) the indexer's q . k score of every head over the valid keys

summed over the chunk's tokens and the selected layers (model.layer_ids(), as bench/roofline.py walks them).
The replicated parts (wq_a + wkv, compressors, indexer) count on every rank: every rank computes them. Norms,
rotary, the compressors' pooling, softmax, the indexer's head weighting and top-K are elementwise or per-row
work and left out, so the model is a lower bound of what runs.
"""

from __future__ import annotations

import math
from collections import Counter

from tp_runtime.config import ModelConfig
from tp_runtime.weights.specs import layer_specs


def weight_params(m: ModelConfig, ratio: int, tp: int) -> int:
    """P_r: GEMM weight parameters one rank holds for a layer of ratio `ratio` (its shard of the split ones)."""
    return sum(math.prod(spec.shape) // (tp if spec.shard_dim is not None else 1)
               for spec in layer_specs(m, 0, ratio) if spec.kind == "matrix")


def weight_flops(m: ModelConfig, ratio: int, tp: int, n_tokens: int) -> int:
    """2 x P_r per token: every weight parameter multiplies and adds once per token."""
    return 2 * weight_params(m, ratio, tp) * n_tokens


def candidate_rows(m: ModelConfig, ratio: int, p: int) -> int:
    """rows(p): the window rows plus the picked (r = 4) or compressed (r = 128) rows token p attends to."""
    rows = min(m.sliding_window, p + 1)
    if ratio == 4:
        rows += min(m.index_topk, (p + 1) // 4)
    elif ratio == 128:
        rows += (p + 1) // 128
    return rows


def attention_flops(m: ModelConfig, ratio: int, tp: int, positions: range) -> int:
    """2 x 2 x Hl x D x rows(p) per token: a QK dot and a PV accumulation of D per head and candidate row."""
    heads = m.num_attention_heads // tp
    return 4 * heads * m.head_dim * sum(candidate_rows(m, ratio, p) for p in positions)


def indexer_flops(m: ModelConfig, ratio: int, positions: range) -> int:
    """2 x Ih x Id x (p + 1) // 4 per token on r = 4 layers: the indexer scores every valid key in every head."""
    if ratio != 4:
        return 0
    return 2 * m.index_n_heads * m.index_head_dim * sum((p + 1) // 4 for p in positions)


def layer_flops(m: ModelConfig, ratio: int, tp: int, ctx: int, n: int) -> int:
    positions = range(ctx, ctx + n)
    return weight_flops(m, ratio, tp, n) + attention_flops(m, ratio, tp, positions) + indexer_flops(m, ratio, positions)


def prefill_flops(m: ModelConfig, tp: int, ctx: int, n: int) -> int:
    """FLOPs one rank of tp computes for a chunk of n tokens at positions ctx .. ctx + n - 1, over the selected
    layers."""
    kinds = Counter(m.compress_ratios[i] for i in m.layer_ids())
    return sum(count * layer_flops(m, r, tp, ctx, n) for r, count in kinds.items())
