"""The bytes one rank holds, from the layouts it allocates: weights, caches and a workspace; and the token rows
of its static step buffers.

    rank_memory(cfg, "cuda")   # {"weights": ..., "caches": ..., "workspace": ...} for one rank of this run
    buffer_capacity(cfg)       # the rows ModelShard allocates its step buffers with

memory_fit.py checks these against a device before any rank starts; bench/roofline.py and bench/sweep_memory.py
build on them. Weights: every tensor of the shard table (weights.layer_specs), the split ones divided by tp.
Caches: model.cache.cache_bytes (slots + the trash slot, max_len positions, state rings included).
"""

from __future__ import annotations

import math

from tp_runtime.config import ModelConfig, RunConfig, breakable_sizes
from tp_runtime.model.cache import cache_bytes
from tp_runtime.weights.specs import is_fp8_param, layer_specs

FP32 = 4
ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}


def buffer_capacity(cfg: RunConfig, oneshot: bool = False) -> int:
    """Tokens the static buffers hold: a whole prompt (oneshot), else the largest step or capture size of either
    graph kind (breakable sizes never exceed runtime.max_tokens_per_step: config.breakable_sizes drops them).
    The same in every graph mode: Workers of several modes may share one shard."""
    rt = cfg.runtime
    return rt.max_len if oneshot else max(rt.max_tokens_per_step, *breakable_sizes(cfg))


def layer_weight_bytes(m: ModelConfig, ratio: int, tp: int, elem: int, fp8: bool = False,
                       kinds: tuple[str, ...] | None = None) -> int:
    """Weight bytes one rank holds (and reads once per step) for one layer of compress ratio `ratio`:
    the shard table's tensors (of `kinds` only, when given), the split ones divided by tp, in the run dtype
    (ape, attn_sink fp32); with fp8, the FP8 matrices as stored: one byte a value plus one e8m0 byte per
    128 x 128 block."""
    total = 0
    for spec in layer_specs(m, 0, ratio, fp8=fp8):
        if kinds is not None and spec.kind not in kinds:
            continue
        split = tp if spec.shard_dim is not None else 1
        n = math.prod(spec.shape) // split
        if is_fp8_param(spec):
            total += n + math.prod(-(-d // 128) for d in spec.shape) // split
        else:
            total += n * (FP32 if spec.kind in ("ape", "sink") else elem)
    return total


def memory_per_rank(m: ModelConfig, tp: int, slots: int, max_len: int, elem: int, fp8: bool = False,
                    fp8_cache: bool = False) -> dict[str, int]:
    """Bytes a rank holds: weights (as in step_bytes) and caches of `slots` sequences of max_len positions."""
    ratios = [m.compress_ratios[i] for i in m.layer_ids()]
    weights = sum(layer_weight_bytes(m, r, tp, elem, fp8) for r in ratios)
    return {"weights": weights, "cache": cache_bytes(m, ratios, slots, max_len, elem, fp8_cache)}


def workspace_bytes(m: ModelConfig, tp: int, tokens: int, max_len: int, elem: int) -> int:
    """Estimated bytes a rank needs besides weights and caches (memory_fit.py checks the sum before a run):
    the rotary tables (window and compressed: max_len + 2 positions x Dr/2 complex64) and the activations of
    one layer's step at `tokens` tokens, which the caching allocator keeps (eager) or the CUDA graph pool
    holds (graphs: every capture size shares one pool, the largest decides). Per token: the hidden state a
    few times (input, norm, output, all-reduce), q_lora, this rank's q and attention output [H/tp, D] (and a
    roped copy), a KV row, the o_lora groups, the indexer queries, and fp32 scores over the window + top-K
    per head and over the max_len / 4 indexer keys. A lower bound: more would refuse runs that fit."""
    heads = m.num_attention_heads // tp
    per_token = elem * (4 * m.hidden_size + m.q_lora_rank + 3 * heads * m.head_dim + 2 * m.head_dim
                        + (m.o_groups // tp) * m.o_lora_rank + m.index_n_heads * m.index_head_dim)
    per_token += FP32 * (heads * (m.sliding_window + m.index_topk) + max_len // 4)
    rotary = 2 * (max_len + 2) * (m.qk_rope_head_dim // 2) * 8
    return tokens * per_token + rotary


def rank_memory(cfg: RunConfig, device_type: str) -> dict[str, int]:
    """Bytes one rank holds by part (weights, caches, workspace), in the layout it will use on device_type."""
    m, r, tp = cfg.model, cfg.runtime, cfg.parallel.tp
    cuda = device_type == "cuda"
    elem = ELEM_BYTES.get(r.dtype, 2 if cuda else 4)  # auto: bfloat16 on GPUs, float32 on CPUs
    mem = memory_per_rank(m, tp, r.max_seqs, r.max_len, elem, cuda and r.weight_format == "fp8",
                          cuda and r.cache_format == "fp8")
    # One step's activations at the step buffers' rows, which the shard allocates in every graph mode. Graphs warm
    # every size up eagerly, release that memory, then capture into the pool (executor/step_graphs.py), so one
    # step's activations at this count are held once, not twice.
    return {"weights": mem["weights"], "caches": mem["cache"],
            "workspace": workspace_bytes(m, tp, buffer_capacity(cfg), r.max_len, elem)}
