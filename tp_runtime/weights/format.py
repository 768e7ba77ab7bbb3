"""The released checkpoint layout: file and dtype names, and the error every checkpoint reader and writer raises.

    DIR/config.json                      model keys, DSV4 names (config.py merges them into the run config)
    DIR/model.safetensors.index.json     {"metadata": {...}, "weight_map": {tensor name: file name}}
    DIR/model-0000k-of-0000n.safetensors
"""

from __future__ import annotations

# Names only, no torch: the command line refuses a checkpoint error without importing it (seconds).
INDEX = "model.safetensors.index.json"
FP8_DTYPE, SCALE_DTYPE = "F8_E4M3", "F8_E8M0"  # safetensors dtype names
PLAIN_DTYPES = ("BF16", "F32", "F16")  # unquantized tensors (released: BF16, and F32 for ape and attn_sink)
ITEM_BYTES = {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F16": 2, "F32": 4}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded or written; the message names the tensor and the file."""


def scale_name(name: str) -> str:
    """'layers.0.attn.wq_b.weight' -> 'layers.0.attn.wq_b.scale' (the released naming)."""
    return name.removesuffix(".weight") + ".scale"
