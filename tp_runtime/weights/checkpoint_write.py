"""Writing synthetic checkpoints in the released DSV4 layout, from a config's seeded weights.

The big matrices (TensorSpec.fp8) are FP8-quantized per 128 x 128 block with power-of-two scales, as
released; the rest is stored bf16, ape and attn_sink fp32.

    tp-runtime write-checkpoint configs/tiny.yaml /tmp/ckpt --files 3
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from tp_runtime.config import RUN_MODEL_KEYS, ModelConfig, RunConfig
from tp_runtime.paths import check_output_dir
from tp_runtime.weights.fill import draw_full
from tp_runtime.weights.format import E8M0, INDEX, CheckpointError, scale_name
from tp_runtime.weights.fp8 import BLOCK, dequantize_fp8, quantize_fp8
from tp_runtime.weights.specs import TensorSpec, layer_specs


def stored_dtype(spec: TensorSpec) -> torch.dtype:
    """Released dtype of an unquantized tensor: fp32 for ape and attn_sink, bf16 for the rest."""
    return torch.float32 if spec.kind in ("ape", "sink") else torch.bfloat16


def encode(spec: TensorSpec, full: torch.Tensor) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one spec: fp8 weight + e8m0 block scales, or the tensor in its released dtype."""
    if not spec.fp8:
        return {spec.name: full.to(stored_dtype(spec)).contiguous()}
    if E8M0 is None:
        raise CheckpointError(f"writing {spec.name} needs torch.float8_e8m0fnu (torch >= 2.7)")
    q, s = quantize_fp8(full)
    return {spec.name: q, scale_name(spec.name): s.view(E8M0)}


def stored_values(spec: TensorSpec, full: torch.Tensor) -> torch.Tensor:
    """What loading recovers from `encode(spec, full)`, in float32: full after its fp8 or bf16 round trip."""
    if spec.fp8:
        return dequantize_fp8(*quantize_fp8(full))
    return full.to(stored_dtype(spec)).float()


def checkpoint_config_json(m: ModelConfig) -> dict:
    """A DSV4 config.json for model m: its model keys plus the released quantization description."""
    d = {k: v for k, v in dataclasses.asdict(m).items() if k not in RUN_MODEL_KEYS}
    d.update(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", torch_dtype="bfloat16",
             quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "scale_fmt": "ue8m0", "weight_block_size": [BLOCK, BLOCK]})
    return d


def _split_layers(layers: list[int], n_files: int) -> list[list[int]]:
    if not 1 <= n_files <= len(layers):
        raise CheckpointError(f"--files={n_files}: a file holds whole layers, so 1 <= files <= {len(layers)} "
                              f"(the layers written)")
    per, extra = divmod(len(layers), n_files)
    bounds = [k * per + min(k, extra) for k in range(n_files + 1)]
    return [layers[bounds[k]: bounds[k + 1]] for k in range(n_files)]


def write_checkpoint(cfg: RunConfig, directory: str | Path, n_files: int = 4) -> dict:
    """Write the seeded weights of cfg's selected layers (all by default) in the released DSV4 layout.

    Layers are split into n_files contiguous groups, one file each (weights next to their scales);
    the seeded draw is the one `fill.init_seeded` uses, on the CPU. Into a reused directory, the shard
    files of an earlier write that this one does not replace are removed (the other files stay).
    Returns a summary.
    """
    m, out = cfg.model, Path(directory)
    groups = _split_layers(m.layer_ids(), n_files)
    check_output_dir(out, "write-checkpoint OUT_DIR")
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for k, layers in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{n_files:05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for spec in (s for i in layers for s in layer_specs(m, i)):
            tensors.update(encode(spec, draw_full(spec, cfg.runtime.seed, torch.device("cpu"))))
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    removed = _remove_stale_shards(out, set(weight_map.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(checkpoint_config_json(m), indent=1) + "\n")
    return {"directory": str(out), "files": n_files, "layers": len(m.layer_ids()), "tensors": len(weight_map),
            "bytes": total, "removed": removed}


SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # the names this writer gives its files


def _remove_stale_shards(out: Path, written: set[str]) -> list[str]:
    """Delete shard files an earlier write left in `out` that this one did not write; their names."""
    stale = sorted(f.name for f in out.iterdir() if SHARD_FILE.fullmatch(f.name) and f.name not in written)
    for name in stale:
        (out / name).unlink()
    return stale
