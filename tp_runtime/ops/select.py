"""Which stage-B kernels a run uses: `runtime.kernels` resolved once for the device and dtype of a shard.

    torch   tp_runtime/ops/torch_path.py and the model's plain torch composition (any device, any dtype)
    triton  the fused kernels of tp_runtime/ops/ (sparse_attention.py, indexer_topk.py, rms_norm.py, rope.py,
            compressor_pool.py): CUDA, bf16 / fp16 / fp32
    auto    triton on a CUDA device when Triton imports and the dtype is not float64, else torch

The model is built with the resolved name and picks each kernel family's implementation from it once,
at construction; nothing else branches on it.
"""

from __future__ import annotations

import torch

from tp_runtime.config import ConfigError, triton_unavailable

CHOICES = ("torch", "triton")
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def resolve_kernels(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' | 'torch' | 'triton' -> 'torch' | 'triton' for a shard on `device` holding `dtype`."""
    if requested == "torch":
        return "torch"
    why = triton_unavailable(device.type)
    if why is None and dtype not in TRITON_DTYPES:
        why = f"a dtype in {[str(d).removeprefix('torch.') for d in TRITON_DTYPES]}, not {dtype}"
    if requested == "auto":
        return "torch" if why else "triton"
    if requested != "triton":
        raise ConfigError(f"'runtime.kernels' must be one of ['auto', 'torch', 'triton'], got {requested!r}")
    if why:
        raise ConfigError(f"'runtime.kernels'=triton needs {why}; use runtime.kernels=torch or auto")
    return "triton"
