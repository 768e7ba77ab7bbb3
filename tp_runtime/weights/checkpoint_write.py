"""Writing synthetic checkpoints in the released DSV4 layout, from a config's seeded weights.

The big matrices (TensorSpec.fp8) are FP8-quantized per 128 x 128 block with power-of-two scales, as
released; the rest is stored bf16, ape and attn_sink fp32. The folder is written whole beside the
target and swapped in at the end (folder_swap.py), so no reader ever sees old and new files mixed.

    tp-runtime write-checkpoint configs/tiny.yaml /tmp/ckpt --files 3
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tp_runtime.config import RUN_MODEL_KEYS, ModelConfig, RunConfig
from tp_runtime.paths import OutputError, atomic_output, check_output_dir, write_text_atomic
from tp_runtime.weights.fill import draw_full
from tp_runtime.weights.folder_swap import carry_over, folder_swap
from tp_runtime.weights.format import INDEX, CheckpointError, scale_name
from tp_runtime.weights.fp8 import BLOCK, E8M0, dequantize_fp8, quantize_fp8
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
    the seeded draw is the one `fill.init_seeded` uses, on the CPU. The checkpoint is written whole into
    a new folder beside `directory` and swapped in at the end, under a lock that refuses a second writer
    (folder_swap.py): an interrupted write leaves the previous folder as it was. Every file is marked as
    this writer's (WRITER in its header or metadata). From a reused directory, only files this writer made
    are replaced, and its shard files that this write does not replace are dropped; any other file at a
    name this write needs is refused before anything is written, and every other entry is kept. Returns a
    summary.
    """
    m, out = cfg.model, Path(directory).expanduser()
    groups = _split_layers(m.layer_ids(), n_files)
    names = [f"model-{k + 1:05d}-of-{n_files:05d}.safetensors" for k in range(n_files)]
    check_output_dir(out, KEY, files=(*names, INDEX, "config.json"))
    with folder_swap(Path(os.path.realpath(out)), f"{KEY}={directory}") as swap:
        old = swap.target if swap.target.is_dir() else None
        if old is not None:
            _refuse_foreign(old, [*names, INDEX, "config.json"])
        weight_map, total = _write_shards(cfg, swap.new, names, groups)
        index = {"metadata": {"total_size": total, "written_by": WRITER},
                 "weight_map": dict(sorted(weight_map.items()))}
        write_text_atomic(swap.new / INDEX, json.dumps(index, indent=1) + "\n")
        write_text_atomic(swap.new / "config.json", json.dumps(checkpoint_config_json(m), indent=1) + "\n")
        removed: list[str] = []
        if old is not None:  # what is not this writer's stays, as it is
            removed = _stale_shards(old, set(names))
            carry_over(old, swap.new, sorted(set(os.listdir(old)) - {*names, *removed, INDEX, "config.json"}))
    return {"directory": str(out), "files": n_files, "layers": len(m.layer_ids()), "tensors": len(weight_map),
            "bytes": total, "removed": removed, "notes": swap.notes}


def _write_shards(cfg: RunConfig, folder: Path, names: list[str], groups: list[list[int]]) -> tuple[dict, int]:
    """One safetensors file per group of layers in folder; returns (tensor name -> file name, bytes)."""
    weight_map: dict[str, str] = {}
    total = 0
    for fname, layers in zip(names, groups):
        tensors: dict[str, torch.Tensor] = {}
        for spec in (s for i in layers for s in layer_specs(cfg.model, i)):
            tensors.update(encode(spec, draw_full(spec, cfg.runtime.seed, torch.device("cpu"))))
        with atomic_output(folder / fname) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt", "written_by": WRITER})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    return weight_map, total


KEY = "write-checkpoint OUT_DIR"
WRITER = "tp_runtime write-checkpoint"  # each shard's header and the index's metadata: "written_by"
SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # the names this writer gives its files


def _regular(p: Path) -> bool:
    """p is a regular file itself (a symlink is not followed: this writer never makes one)."""
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def _our_shard(p: Path) -> bool:
    """p is a shard this writer made: a regular file whose safetensors header names WRITER."""
    if not _regular(p):
        return False
    try:
        with safe_open(str(p), "pt") as f:
            return (f.metadata() or {}).get("written_by") == WRITER
    except (SafetensorError, OSError):
        return False


def _our_index(p: Path) -> bool:
    """p is an index this writer made: a regular file whose JSON metadata names WRITER."""
    if not _regular(p):
        return False
    try:
        meta = json.loads(p.read_text()).get("metadata")
        return isinstance(meta, dict) and meta.get("written_by") == WRITER
    except (OSError, ValueError, AttributeError):
        return False


def _refuse_foreign(out: Path, names: list[str]) -> None:
    """Refuse, before anything is written, a file at one of `names` in out that this writer did not
    make (config.json counts as its own when the index beside it is)."""
    own_index = _our_index(out / INDEX)
    for name in names:
        p = out / name
        if not os.path.lexists(p):
            continue
        own = own_index if name in (INDEX, "config.json") else _our_shard(p)
        if not own:
            raise OutputError(f"{KEY}={out}: {p} exists and was not written by write-checkpoint; it is never "
                              f"replaced (use a new or empty directory, or remove it)")


def _stale_shards(out: Path, written: set[str]) -> list[str]:
    """The shard files an earlier write of this writer left in `out` that this one does not write."""
    return sorted(f.name for f in out.iterdir()
                  if SHARD_FILE.fullmatch(f.name) and f.name not in written and _our_shard(f))
