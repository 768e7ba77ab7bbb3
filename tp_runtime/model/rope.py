"""Rotary angles for the trailing Dr dims, GPT-J interleaved pairs, with YaRN for compressed layers.

Pair i of the rotated slice, (x[2i], x[2i+1]), turns by pos * f_i with f_i = base^(-2i/Dr).
Window-only layers use rope_theta without YaRN; compressed layers and their indexer use
compress_rope_theta with YaRN frequency interpolation: frequencies between the correction range's
ends blend f_i and f_i / factor (yarn_correction_range). No attention-scale correction.
The angles are kept as unit complex numbers, so a rotation is one complex multiply (the backend's
rotary: ops/torch_path.py `apply_rotary`, or the Triton kernels' `rotate_pairs`): complex64 for runs in
float32 or bfloat16, complex128 for float64 runs (complex64 angles alone err by ~1e-7, above float64's
check tolerance).
"""

from __future__ import annotations

import math

import torch

from tp_runtime.config import ModelConfig, RopeScaling


def yarn_correction_range(dr: int, base: float, s: RopeScaling) -> tuple[float, float]:
    """[lo, hi] in pair index between which YaRN blends original and interpolated frequencies."""

    def corr(beta: float) -> float:
        return dr * math.log(s.original_max_position_embeddings / (2 * math.pi * beta)) / (2 * math.log(base))

    lo = max(0, math.floor(corr(s.beta_fast)))
    hi = min(dr - 1, math.ceil(corr(s.beta_slow)))
    return lo, hi


def inv_frequencies(dr: int, base: float, scaling: RopeScaling | None) -> torch.Tensor:
    """f_i for i in [0, Dr/2), float64; YaRN-interpolated when `scaling` is given."""
    i = torch.arange(dr // 2, dtype=torch.float64)
    f = base ** (-2 * i / dr)
    if scaling is None:
        return f
    lo, hi = yarn_correction_range(dr, base, scaling)
    ramp = ((i - lo) / max(hi - lo, 1e-3)).clamp(0, 1)  # 0 below lo (keep f), 1 above hi (f / factor)
    keep = 1 - ramp
    return f / scaling.factor * (1 - keep) + f * keep


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The rotary angles' dtype for a run in `dtype`: complex128 for float64, else complex64."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class RotaryTable:
    """exp(i * pos * f_i) for every position a run can reach: cis [max_pos, Dr/2] on the device, complex64
    (complex128 for a float64 run: `complex_dtype`)."""

    def __init__(self, dr: int, base: float, scaling: RopeScaling | None, max_pos: int, device: torch.device,
                 dtype: torch.dtype = torch.float32):
        angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_frequencies(dr, base, scaling)[None]
        self.cis = torch.polar(torch.ones_like(angles), angles).to(complex_dtype(dtype)).to(device)

    @classmethod
    def for_kind(cls, cfg: ModelConfig, kind: str, max_pos: int, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> "RotaryTable":
        """'window' (window-only layers: rope_theta) or 'compressed' (compress_rope_theta with YaRN), for a run
        in `dtype`."""
        if kind == "window":
            return cls(cfg.qk_rope_head_dim, cfg.rope_theta, None, max_pos, device, dtype)
        return cls(cfg.qk_rope_head_dim, cfg.compress_rope_theta, cfg.rope_scaling, max_pos, device, dtype)

    def at(self, pos: torch.Tensor) -> torch.Tensor:
        """cis at positions pos [T] -> [T, Dr/2]."""
        return self.cis[pos]
