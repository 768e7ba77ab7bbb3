"""Roofline of one decode step per rank: the bytes it must read over the measured bandwidth (the higher
of a device copy and a read-only stream, both measured in the same launch: bench/measure.py), plus the
measured all-reduce latency once per layer.

Bytes read per rank and step (each counted once; activations and cache writes are a few rows and left out):
  weights  every tensor of the shard table (weights.layer_specs): this rank's share of wq_b, wo_a, wo_b
           and attn_sink (sharded by tp) and the replicated wq_a + wkv, q_norm, kv_norm, attn_norm,
           compressor (r > 0) and indexer (r = 4) tensors, in the run dtype (ape and attn_sink fp32);
  cache    per sequence and layer, in the cache dtype: the window rows min(W, ctx); r = 4: the selected
           compressed rows min(K, ctx // 4) and the indexer keys ctx // 4 rows of Id; r = 128: all
           ctx // 128 compressed rows. Every rank reads these whole: the one KV row per token is shared
           by all heads, so the cache does not shrink with tp. (The compressor state, read once per block,
           is left out.)
ctx is the number of tokens in the cache when the step runs (the decode position).

    model_s = (weights + cache) / bandwidth + n_layers * allreduce_latency   (tp > 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tp_runtime.config import ModelConfig
from tp_runtime.weights.specs import is_fp8_param, layer_specs

FP32 = 4


@dataclass(frozen=True)
class StepBytes:
    weights: int
    cache: int

    @property
    def total(self) -> int:
        return self.weights + self.cache

    def __add__(self, other: "StepBytes") -> "StepBytes":
        return StepBytes(self.weights + other.weights, self.cache + other.cache)


def layer_weight_bytes(m: ModelConfig, ratio: int, tp: int, elem: int, fp8: bool = False) -> int:
    """Weight bytes one rank holds (and reads once per step) for one layer of compress ratio `ratio`:
    the shard table's tensors, the split ones divided by tp, in the run dtype (ape, attn_sink fp32); with
    fp8, the FP8 matrices as stored: one byte a value plus one e8m0 byte per 128 x 128 block."""
    total = 0
    for spec in layer_specs(m, 0, ratio, fp8=fp8):
        split = tp if spec.shard_dim is not None else 1
        n = math.prod(spec.shape) // split
        if is_fp8_param(spec):
            total += n + math.prod(-(-d // 128) for d in spec.shape) // split
        else:
            total += n * (FP32 if spec.kind in ("ape", "sink") else elem)
    return total


def layer_cache_bytes(m: ModelConfig, ratio: int, batch: int, ctx: int, elem: int) -> int:
    """Cache bytes attention reads for one layer at a decode step of `batch` sequences holding ctx tokens."""
    rows = min(m.sliding_window, ctx) * m.head_dim
    if ratio == 4:
        rows += min(m.index_topk, ctx // 4) * m.head_dim + (ctx // 4) * m.index_head_dim
    elif ratio == 128:
        rows += (ctx // 128) * m.head_dim
    return batch * rows * elem


def step_bytes(m: ModelConfig, tp: int, batch: int, ctx: int, elem: int, fp8: bool = False) -> StepBytes:
    """Bytes one rank reads in a decode step over the selected layers (model.layer_ids())."""
    total = StepBytes(0, 0)
    for r in (m.compress_ratios[i] for i in m.layer_ids()):
        total = total + StepBytes(layer_weight_bytes(m, r, tp, elem, fp8), layer_cache_bytes(m, r, batch, ctx, elem))
    return total


def model_seconds(nbytes: int, bytes_per_s: float, n_layers: int, allreduce_s: float, tp: int) -> float:
    """Ideal step time: every byte read once at the measured bandwidth, plus one all-reduce per layer."""
    comm = n_layers * allreduce_s if tp > 1 else 0.0
    return nbytes / bytes_per_s + comm
