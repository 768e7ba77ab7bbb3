"""Roofline of one decode step per rank: the bytes it must read over the measured bandwidth (the higher
of a device copy and a read-only stream, both measured in the same launch: bench/measure.py), plus the
measured all-reduce latency once per layer.

Bytes read per rank and step (each counted once; activations and cache writes are a few rows and left out):
  weights  every tensor of the shard table (weights.layer_specs): this rank's share of wq_b, wo_a, wo_b
           and attn_sink (sharded by tp) and the replicated wq_a + wkv, q_norm, kv_norm, attn_norm,
           compressor (r > 0) and indexer (r = 4) tensors, in the run dtype (ape and attn_sink fp32);
  cache    per sequence and layer, in the stored layout (runtime.cache_format: bf16 rows of D and keys of Id
           in the run dtype; fp8 rows of row_bytes(D, Dr) = 592 and keys of Id + 4 = 132 bytes at Flash
           dims, ops/cache_fp8.py): the window rows min(W, ctx); r = 4: the selected
           compressed rows min(K, ctx // 4) and the indexer keys ctx // 4 rows of Id; r = 128: all
           ctx // 128 compressed rows. Every rank reads these whole: the one KV row per token is shared
           by all heads, so the cache does not shrink with tp. (The compressor state, read once per block,
           is left out.)
ctx is the number of tokens in the cache when the step runs (the decode position).

    model_s = (weights + cache) / bandwidth + n_layers * allreduce_latency   (tp > 1)

Memory per rank (weights held plus caches allocated) is memory_model.py's; `largest_batches` is the largest
batch per context that fits a device.
`python -m tp_runtime.bench.roofline CONFIG [GiB] [key=value ...]` prints it for both cache formats
(default 139 GiB: one H200 as torch reports it).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from tp_runtime.bench.flops import candidate_rows
from tp_runtime.config import ModelConfig
from tp_runtime.memory_model import layer_weight_bytes, memory_per_rank
from tp_runtime.model.cache import row_widths


@dataclass(frozen=True)
class StepBytes:
    weights: int
    cache: int

    @property
    def total(self) -> int:
        return self.weights + self.cache

    def __add__(self, other: "StepBytes") -> "StepBytes":
        return StepBytes(self.weights + other.weights, self.cache + other.cache)


def stored_bytes(m: ModelConfig, elem: int, fp8_cache: bool) -> tuple[int, int]:
    """Bytes of one attention row and of one indexer key as the caches store them."""
    row, key = row_widths(m, fp8_cache)  # bytes with FP8 caches, elements of `elem` bytes otherwise
    return (row, key) if fp8_cache else (row * elem, key * elem)


def layer_cache_bytes(m: ModelConfig, ratio: int, batch: int, ctx: int, elem: int, fp8_cache: bool = False) -> int:
    """Cache bytes attention reads for one layer at a decode step of `batch` sequences holding ctx tokens:
    the rows a token at position ctx - 1 attends to (flops.candidate_rows), and on r = 4 every indexer key."""
    row, key = stored_bytes(m, elem, fp8_cache)
    nbytes = candidate_rows(m, ratio, ctx - 1) * row
    if ratio == 4:
        nbytes += (ctx // 4) * key
    return batch * nbytes


def step_bytes(m: ModelConfig, tp: int, batch: int, ctx: int, elem: int, fp8: bool = False,
               fp8_cache: bool = False) -> StepBytes:
    """Bytes one rank reads in a decode step over the selected layers (model.layer_ids())."""
    total = StepBytes(0, 0)
    for r in (m.compress_ratios[i] for i in m.layer_ids()):
        total = total + StepBytes(layer_weight_bytes(m, r, tp, elem, fp8),
                                  layer_cache_bytes(m, r, batch, ctx, elem, fp8_cache))
    return total


def largest_batches(m: ModelConfig, tp: int, elem: int, device_bytes: int, contexts: list[int], fp8: bool = False,
                    fp8_cache: bool = False, reserve: float = 0.1) -> dict[int, int]:
    """Per context (max_len = context), the largest batch whose weights + caches fit in (1 - reserve) of
    device_bytes; the reserve stands for activations, graph pools and the allocator's slack. 0: none fits."""
    budget = int(device_bytes * (1 - reserve))
    out = {}
    for ctx in contexts:
        weights = memory_per_rank(m, tp, 0, ctx, elem, fp8, fp8_cache)["weights"]
        per_slot = memory_per_rank(m, tp, 1, ctx, elem, fp8, fp8_cache)["cache"] // 2  # (1 + trash) slots
        out[ctx] = max(0, (budget - weights) // per_slot - 1)  # one slot is the trash slot
    return out


def model_seconds(nbytes: int, bytes_per_s: float, n_layers: int, allreduce_s: float, tp: int) -> float:
    """Ideal step time: every byte read once at the measured bandwidth, plus one all-reduce per layer."""
    comm = n_layers * allreduce_s if tp > 1 else 0.0
    return nbytes / bytes_per_s + comm


def fit_table(m: ModelConfig, tp: int, elem: int, device_bytes: int, contexts: list[int], fp8: bool = False,
              cache_formats: tuple[bool, ...] = (False, True)) -> str:
    """Per cache format (False: bf16, True: fp8), memory per rank at one slot and the largest batch per context
    (largest_batches)."""
    lines = [f"{'cache':>6} {'context':>8} {'cache MiB/seq':>14} {'largest batch':>14}"]
    for fp8_cache in cache_formats:
        fits = largest_batches(m, tp, elem, device_bytes, contexts, fp8, fp8_cache)
        for ctx in contexts:
            per_seq = memory_per_rank(m, tp, 1, ctx, elem, fp8, fp8_cache)["cache"] / 2
            lines.append(f"{'fp8' if fp8_cache else 'bf16':>6} {ctx:>8} {per_seq / 2**20:>14.1f} {fits[ctx]:>14}")
    return "\n".join(lines)


USAGE = "usage: python -m tp_runtime.bench.roofline CONFIG [GiB] [key=value ...]"


def main(args: list[str]) -> int:
    """Print the fit table of CONFIG (with overrides) on a device of GiB (default 139: one H200); a bad argument or
    config is one `error:` line and exit status 2."""
    from tp_runtime.config import ConfigError, load_config

    if not args or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    gib = 139.0  # one H200
    if len(args) > 1 and "=" not in args[1]:
        word = args.pop(1)
        try:
            gib = float(word)
        except ValueError:
            gib = math.nan
        if not (math.isfinite(gib) and gib > 0):
            print(f"error: device memory {word!r} must be a finite number of GiB > 0 ({USAGE})", file=sys.stderr)
            return 2
    try:
        cfg = load_config(args[0], args[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = cfg.model
    # FP8 cache rows scale the nope dims in blocks of 64: a model whose nope dims are not whole blocks has none.
    fp8_rows = (m.head_dim - m.qk_rope_head_dim) % 64 == 0
    dtype = {"float32": 4, "float64": 8}.get(cfg.runtime.dtype, 2)
    print(f"tp={cfg.parallel.tp}, {len(m.layer_ids())} layers, {gib:g} GiB, 90% for weights + caches")
    print(fit_table(m, cfg.parallel.tp, dtype, int(gib * 2**30), [4096, 32768, 65536, 131072],
                    cfg.runtime.weight_format == "fp8", (False, True) if fp8_rows else (False,)))
    if not fp8_rows:
        print(f"(no fp8 cache rows: head_dim - qk_rope_head_dim = {m.head_dim - m.qk_rope_head_dim} is not a multiple "
              "of 64)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
