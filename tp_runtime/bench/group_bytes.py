"""Bytes a decode step must move, per kernel group of the profile view (bench/profile.py GROUPS), per rank.

The roofline's bytes (bench/roofline.py) split by the kernels that move them, plus the activations the
attention and indexer kernels read and write. Over the view's GPU ms of a group they give that group's
share of the bandwidth: how far each kind of kernel is from moving its bytes at the memory's speed.

Per selected layer of compress ratio r, B sequences holding ctx tokens, Hl = H / tp heads, elem bytes a value:

    weight GEMMs  the layer's matrices on this rank (weights.layer_specs kind "matrix", the split ones / tp;
                  FP8 weights: a byte a value + an e8m0 byte per 128 x 128 block). The compressors' and the
                  indexer's projections are matrices of the layer's GEMMs too.
    attention     B x [rows x row_bytes + 2 x Hl x D x elem (q read, output written) + 8 x picks]
                  rows = min(W, ctx) window rows + min(K, ctx // 4) picks (r = 4) or ctx // 128 entries (r = 128):
                  flops.candidate_rows at position ctx - 1
    indexer       r = 4: B x [ctx // 4 x key_bytes + Ih x Id x elem (q) + Ih x elem (head weights)
                                + 8 x min(K, ctx // 4) (picks written)]
    all-reduce    tp > 1: B x hidden x elem, the layer's output, once

row_bytes / key_bytes as stored (runtime.cache_format: D x elem and Id x elem, or the FP8 layouts' 592 and
132 bytes at Flash dims). The other groups (norms and rotary, compressors, step index, copies, other) move
a few rows a token and have no entry: their share is not computed.
"""

from __future__ import annotations

from tp_runtime.bench.flops import candidate_rows
from tp_runtime.bench.roofline import stored_bytes
from tp_runtime.config import ModelConfig
from tp_runtime.memory_model import layer_weight_bytes

INDEX_BYTES = 8  # a pick is an int64 row index


def _picks(m: ModelConfig, ratio: int, ctx: int) -> int:
    """The indexer's picks a token holding ctx tokens gets (r = 4), else 0."""
    return min(m.index_topk, ctx // 4) if ratio == 4 else 0


def attention_bytes(m: ModelConfig, ratio: int, tp: int, batch: int, ctx: int, elem: int, fp8_cache: bool) -> int:
    row, _ = stored_bytes(m, elem, fp8_cache)
    heads = m.num_attention_heads // tp
    return batch * (candidate_rows(m, ratio, ctx - 1) * row + 2 * heads * m.head_dim * elem
                    + INDEX_BYTES * _picks(m, ratio, ctx))


def indexer_bytes(m: ModelConfig, ratio: int, batch: int, ctx: int, elem: int, fp8_cache: bool) -> int:
    if ratio != 4:
        return 0
    _, key = stored_bytes(m, elem, fp8_cache)
    q = m.index_n_heads * (m.index_head_dim + 1) * elem  # q and the heads' weights
    return batch * ((ctx // 4) * key + q + INDEX_BYTES * _picks(m, ratio, ctx))


def group_bytes(m: ModelConfig, tp: int, batch: int, ctx: int, elem: int, fp8: bool = False,
                fp8_cache: bool = False) -> dict[str, int]:
    """Bytes per group over the selected layers (model.layer_ids()) of one decode step on one rank."""
    out = {"weight GEMMs": 0, "attention": 0, "indexer": 0}
    if tp > 1:
        out["all-reduce"] = 0
    for r in (m.compress_ratios[i] for i in m.layer_ids()):
        out["weight GEMMs"] += layer_weight_bytes(m, r, tp, elem, fp8, kinds=("matrix",))
        out["attention"] += attention_bytes(m, r, tp, batch, ctx, elem, fp8_cache)
        out["indexer"] += indexer_bytes(m, r, batch, ctx, elem, fp8_cache)
        if tp > 1:
            out["all-reduce"] += batch * m.hidden_size * elem
    return out


def bandwidth_shares(nbytes: dict[str, int], ms: dict[str, float], bytes_per_s: float) -> dict[str, float | None]:
    """Per group with bytes: its bytes over its GPU time, as a share of bytes_per_s (None without time)."""
    return {g: (b / (ms[g] / 1e3) / bytes_per_s if ms.get(g) else None) for g, b in nbytes.items()}
