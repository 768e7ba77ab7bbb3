"""Filling a stack's parameters: seeded weights identical for every tp, or a checkpoint's shard.

A seeded draw makes the full tensor from (seed, name) on the run's device and keeps this rank's
shard, so tp = 1 and tp = 4, CPU and GPU hold the same model. Either way every placed tensor is
checked for NaN and inf on its device (finite.py) before the stack is used.
"""

from __future__ import annotations

import torch

from tp_runtime.model.stack import AttentionStack
from tp_runtime.ops.linear import dequantize
from tp_runtime.weights.checkpoint_read import load_checkpoint
from tp_runtime.weights.finite import FiniteCheck
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.seeded import named_normal
from tp_runtime.weights.specs import TensorSpec, is_fp8_param, model_specs, place, place_fp8, scale_blocks, shard_of


def draw_full(spec: TensorSpec, seed: int, device: torch.device) -> torch.Tensor:
    """The full fp32 tensor a seeded model holds under spec.name: a function of (seed, name, element
    index) only, so identical on every rank, tp and device (seeded.py)."""
    z = named_normal(seed, spec.name, spec.shape, device)
    if spec.kind == "matrix":
        return z / spec.shape[1] ** 0.5  # unit-scale outputs for unit-scale inputs
    if spec.kind == "norm":
        return 1.0 + 0.1 * z
    if spec.kind == "ape":
        return 0.5 * z
    return z  # sink: logits of the same order as the attention scores


def init_seeded(stack: AttentionStack, seed: int) -> None:
    """Fill every parameter with this rank's shard of the seeded full tensors. With FP8 weights the
    released FP8 matrices are quantized per 128 x 128 block as `write-checkpoint` stores them."""
    check = FiniteCheck()
    with torch.no_grad():
        for spec in model_specs(stack.cfg, stack.fp8):
            full = draw_full(spec, seed, stack.device)
            if is_fp8_param(spec):
                q, scale = quantize_fp8(full)
                rows, cols = scale_blocks(spec, stack.tp)
                placed = place_fp8(stack, spec, shard_of(spec, q, stack.tp), scale[rows, cols])
            else:
                placed = place(stack, spec, shard_of(spec, full, stack.tp))
            check.add(spec.name, f"the seeded draw (runtime.seed={seed})", placed)
    check.raise_if_any()


def fill_weights(stack: AttentionStack, checkpoint: str | None, seed: int) -> dict:
    """A checkpoint's shard when one is given (its load report), else the seeded draw ({})."""
    with torch.no_grad():
        if checkpoint:
            return load_checkpoint(stack, checkpoint)
        init_seeded(stack, seed)
    return {}


def full_tensors(stack: AttentionStack) -> dict[str, torch.Tensor]:
    """Checkpoint-named full tensors of an unsharded (tp = 1) stack: the oracle's input."""
    if stack.tp.size != 1:
        raise ValueError("full_tensors needs an unsharded stack (tp = 1)")
    out = {}
    for spec in model_specs(stack.cfg, stack.fp8):
        w = stack.get_parameter(spec.param).narrow(0, spec.row_offset, spec.shape[0])
        if is_fp8_param(spec):  # the values the FP8 GEMM computes with: dequantized, exactly
            scale = stack.get_parameter(spec.param.removesuffix("qweight") + "scale")
            w = dequantize(w, scale.narrow(0, spec.row_offset // 128, -(-spec.shape[0] // 128)), stack.dtype)
        out[spec.name] = w
    return out
