"""The shard table: one row per checkpoint tensor, and where a rank's shard of it goes.

One table (`model_specs`) drives the seeded draw (fill.py), checkpoint reading and checkpoint
writing: for each checkpoint tensor it gives the full shape, the parameter it fills (and where, for
fused GEMMs), and the dimension split across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.config import ModelConfig
from tp_runtime.model.attention import FP8_X, x_gemms
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


def layer_specs(cfg: ModelConfig, i: int, ratio: int | None = None, fp8: bool = False) -> list[TensorSpec]:
    """Every checkpoint tensor of layer i (of compress ratio `ratio`, default the layer's own). fp8: the
    tensors released in FP8 fill `<module>.qweight` and `<module>.scale` instead of `<module>.weight`."""
    hid, D, H, G = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.o_groups
    Rq, Ro = cfg.q_lora_rank, cfg.o_lora_rank
    r = cfg.compress_ratios[i] if ratio is None else ratio
    a = f"layers.{i}.attn."

    def fp8_matrix(module: str, shape: tuple[int, int], shard_dim: int | None = None) -> TensorSpec:
        return TensorSpec(a + module + ".weight", shape, a + module + (".qweight" if fp8 else ".weight"),
                          shard_dim=shard_dim, fp8=True)

    specs = [TensorSpec(f"layers.{i}.attn_norm.weight", (hid,), f"layers.{i}.attn_norm.weight", kind="norm")]
    specs += _x_specs(cfg, a, r, fp8)
    specs += [
        TensorSpec(a + "q_norm.weight", (Rq,), a + "q_norm.weight", kind="norm"),
        TensorSpec(a + "kv_norm.weight", (D,), a + "kv_norm.weight", kind="norm"),
        fp8_matrix("wq_b", (H * D, Rq), shard_dim=0),
        TensorSpec(a + "attn_sink", (H,), a + "attn_sink", shard_dim=0, kind="sink"),
        fp8_matrix("wo_a", (G * Ro, H * D // G), shard_dim=0),
        fp8_matrix("wo_b", (hid, G * Ro), shard_dim=1),
    ]
    if r:
        specs += _compressor_specs(a + "compressor.", r, D)
    if r == 4:
        Ih, Id = cfg.index_n_heads, cfg.index_head_dim
        specs.append(fp8_matrix("indexer.wq_b", (Ih * Id, Rq)))
        specs += _compressor_specs(a + "indexer.compressor.", 4, Id)
    return specs


def _x_specs(cfg: ModelConfig, a: str, r: int, fp8: bool) -> list[TensorSpec]:
    """The projections of x, each at its rows of the fused GEMM that holds it (attention.x_gemms).
    wq_a and wkv are FP8 in released checkpoints; the compressor and indexer projections bf16."""
    specs = []
    for module, holds_fp8, rows in x_gemms(cfg, r, fp8):
        row, param = 0, a + module + (".qweight" if holds_fp8 else ".weight")
        for name, n in rows:
            specs.append(TensorSpec(a + name + ".weight", (n, cfg.hidden_size), param, row_offset=row,
                                    fp8=name in FP8_X))
            row += n
    return specs


def fp8_gemm_shapes(cfg: ModelConfig, tp: int) -> dict[str, tuple[int, int, int]]:
    """weight -> (N, K, groups) of each FP8 GEMM one rank of `tp` runs (N: all of its output rows; wo_a: one
    grouped GEMM of its G / tp groups): the shapes the FP8 GEMM family's tuning table is keyed by."""
    H, D, G = cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
    Rq, Ro, hid = cfg.q_lora_rank, cfg.o_lora_rank, cfg.hidden_size
    return {"wq_a+wkv": (Rq + D, hid, 1), "wq_b": (H * D // tp, Rq, 1), "wo_a": (G * Ro // tp, H * D // G, G // tp),
            "wo_b": (hid, G * Ro // tp, 1), "indexer.wq_b": (cfg.index_n_heads * cfg.index_head_dim, Rq, 1)}


def is_fp8_param(spec: TensorSpec) -> bool:
    """The spec fills an FP8 parameter (qweight, with its block scales beside it)."""
    return spec.param.endswith(".qweight")


def _compressor_specs(p: str, r: int, dim: int) -> list[TensorSpec]:
    c = 2 if r == 4 else 1
    return [
        TensorSpec(p + "ape", (r, c * dim), p + "ape", kind="ape"),
        TensorSpec(p + "norm.weight", (dim,), p + "norm.weight", kind="norm"),
    ]


def model_specs(cfg: ModelConfig, fp8: bool = False) -> list[TensorSpec]:
    return [s for i in cfg.layer_ids() for s in layer_specs(cfg, i, fp8=fp8)]


def shard_of(spec: TensorSpec, full: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """This rank's slice of a full tensor."""
    if spec.shard_dim is None:
        return full
    lo, hi = tp.shard(spec.shape[spec.shard_dim], f"{spec.name} dim {spec.shard_dim}")
    return full.narrow(spec.shard_dim, lo, hi - lo)


def scale_blocks(spec: TensorSpec, tp: TPGroup) -> tuple[slice, slice]:
    """The 128 x 128 scale blocks of this rank's shard of an FP8 matrix; ValueError where the shard
    boundary falls inside a block (its scale would be shared with another rank's rows or columns)."""
    rows, cols = slice(0, -(-spec.shape[0] // 128)), slice(0, -(-spec.shape[1] // 128))
    if spec.shard_dim is None:
        return rows, cols
    lo, hi = tp.shard(spec.shape[spec.shard_dim], f"{spec.name} dim {spec.shard_dim}")
    if lo % 128 or (hi % 128 and hi != spec.shape[spec.shard_dim]):
        raise ValueError(f"runtime.weight_format=fp8: tp={tp.size} splits {spec.name} {list(spec.shape)} at "
                         f"{'row' if spec.shard_dim == 0 else 'column'} {lo if lo % 128 else hi}, inside a 128 x 128 "
                         "scale block; use a tp whose shards are whole blocks, or weight_format=bf16")
    blocks = slice(lo // 128, -(-hi // 128))
    return (blocks, cols) if spec.shard_dim == 0 else (rows, blocks)


def place_fp8(stack: AttentionStack, spec: TensorSpec, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Copy an FP8 shard q [rows, cols] and its e8m0 scale bytes into `qweight` / `scale` (at its rows of a
    fused parameter, which start on a 128-row block); returns the filled FP8 values."""
    placed = place(stack, spec, q)
    sp = stack.get_parameter(spec.param.removesuffix("qweight") + "scale")
    b0 = spec.row_offset // 128
    if spec.row_offset % 128 or scale.shape[1:] != sp.shape[1:] or b0 + scale.shape[0] > sp.shape[0]:
        raise ValueError(f"{spec.name}: scale blocks {tuple(scale.shape)} do not fit {tuple(sp.shape)} at row "
                         f"{spec.row_offset}")
    sp.narrow(0, b0, scale.shape[0]).copy_(scale)
    return placed


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


def check_fp8_shards(cfg: ModelConfig, tp: int) -> None:
    """ValueError naming the first FP8 matrix whose shard, on any of tp ranks, splits a scale block."""
    for spec in model_specs(cfg, fp8=True):
        if is_fp8_param(spec):
            for rank in range(tp):
                scale_blocks(spec, TPGroup(rank, tp, torch.device("cpu")))
