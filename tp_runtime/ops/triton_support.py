"""Triton, where it can run: imported once, None where it is missing (the CPU suite needs no Triton)."""

from __future__ import annotations

import torch

try:
    import triton
except ImportError:  # no Triton in this environment: every kernel falls back to its torch path
    triton = None


def triton_available() -> bool:
    """Triton importable and a CUDA device present (or its CPU interpreter switched on, for kernel tests)."""
    import os

    return triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
