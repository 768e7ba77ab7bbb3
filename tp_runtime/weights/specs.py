"""The shard table: one row per checkpoint tensor, and where a rank's shard of it goes.

One table (`model_specs`) drives the seeded draw (fill.py), checkpoint reading and checkpoint
writing: for each checkpoint tensor it gives the full shape, the parameter it fills (and where, for
fused GEMMs), and the dimension split across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.config import ModelConfig
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import TPGroup


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint name, e.g. "layers.3.attn.wq_b.weight"
    shape: tuple[int, ...]  # full, unsharded shape
    param: str  # parameter of AttentionStack it fills
    shard_dim: int | None = None  # dimension split across TP ranks; None = replicated
    row_offset: int = 0  # first row inside a fused parameter
    kind: str = "matrix"  # matrix | norm | sink | ape: decides the seeded draw
    fp8: bool = False  # stored as float8_e4m3fn with 128x128 block scales in released checkpoints


def layer_specs(cfg: ModelConfig, i: int, ratio: int | None = None) -> list[TensorSpec]:
    """Every checkpoint tensor of layer i (of compress ratio `ratio`, default the layer's own)."""
    hid, D, H, G = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.o_groups
    Rq, Ro = cfg.q_lora_rank, cfg.o_lora_rank
    r = cfg.compress_ratios[i] if ratio is None else ratio
    a = f"layers.{i}.attn."
    specs = [
        TensorSpec(f"layers.{i}.attn_norm.weight", (hid,), f"layers.{i}.attn_norm.weight", kind="norm"),
        TensorSpec(a + "wq_a.weight", (Rq, hid), a + "wqkv_a.weight", fp8=True),
        TensorSpec(a + "wkv.weight", (D, hid), a + "wqkv_a.weight", row_offset=Rq, fp8=True),
        TensorSpec(a + "q_norm.weight", (Rq,), a + "q_norm.weight", kind="norm"),
        TensorSpec(a + "kv_norm.weight", (D,), a + "kv_norm.weight", kind="norm"),
        TensorSpec(a + "wq_b.weight", (H * D, Rq), a + "wq_b.weight", shard_dim=0, fp8=True),
        TensorSpec(a + "attn_sink", (H,), a + "attn_sink", shard_dim=0, kind="sink"),
        TensorSpec(a + "wo_a.weight", (G * Ro, H * D // G), a + "wo_a.weight", shard_dim=0, fp8=True),
        TensorSpec(a + "wo_b.weight", (hid, G * Ro), a + "wo_b.weight", shard_dim=1, fp8=True),
    ]
    if r:
        specs += _compressor_specs(a + "compressor.", r, D, hid)
    if r == 4:
        Ih, Id = cfg.index_n_heads, cfg.index_head_dim
        specs += [
            TensorSpec(a + "indexer.wq_b.weight", (Ih * Id, Rq), a + "indexer.wq_b.weight", fp8=True),
            TensorSpec(a + "indexer.weights_proj.weight", (Ih, hid), a + "indexer.weights_proj.weight"),
        ]
        specs += _compressor_specs(a + "indexer.compressor.", 4, Id, hid)
    return specs


def _compressor_specs(p: str, r: int, dim: int, hid: int) -> list[TensorSpec]:
    c = 2 if r == 4 else 1
    return [
        TensorSpec(p + "wkv.weight", (c * dim, hid), p + "wkv.weight"),
        TensorSpec(p + "wgate.weight", (c * dim, hid), p + "wgate.weight"),
        TensorSpec(p + "ape", (r, c * dim), p + "ape", kind="ape"),
        TensorSpec(p + "norm.weight", (dim,), p + "norm.weight", kind="norm"),
    ]


def model_specs(cfg: ModelConfig) -> list[TensorSpec]:
    return [s for i in cfg.layer_ids() for s in layer_specs(cfg, i)]


def shard_of(spec: TensorSpec, full: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """This rank's slice of a full tensor."""
    if spec.shard_dim is None:
        return full
    lo, hi = tp.shard(spec.shape[spec.shard_dim], f"{spec.name} dim {spec.shard_dim}")
    return full.narrow(spec.shard_dim, lo, hi - lo)


def place(stack: AttentionStack, spec: TensorSpec, shard: torch.Tensor) -> torch.Tensor:
    """Copy a shard into its parameter (at its rows of a fused parameter); shapes must agree.
    Returns the filled part of the parameter."""
    param = stack.get_parameter(spec.param)
    fits = (shard.dim() == param.dim() and shard.shape[1:] == param.shape[1:]
            and spec.row_offset + shard.shape[0] <= param.shape[0])
    if not fits:
        raise ValueError(f"{spec.name}: shard shape {tuple(shard.shape)} does not fit parameter "
                         f"{spec.param} {tuple(param.shape)} at row {spec.row_offset}")
    return param.narrow(0, spec.row_offset, shard.shape[0]).copy_(shard)
