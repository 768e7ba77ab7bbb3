"""What every Triton kernel file of ops/ shares: Triton itself where installed, `jit`, the SM count, and
the alignment a kernel may promise for row offsets.

On CPU installs without Triton the kernel modules still import (`triton` and `tl` are None and `jit`
leaves functions as they are); their kernels cannot run, and the torch path does the work.
"""

from __future__ import annotations

import functools
import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def jit(fn):
    """triton.jit where Triton is installed, else the plain function (never called)."""
    return triton.jit(fn) if triton is not None else fn


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, which grids are sized by; an H200's 132 elsewhere
    (Triton's interpreter in the tests)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_align(*strides: int) -> int:
    """The largest power of two (<= 16) dividing every row stride, in elements: what a kernel may promise
    the compiler about row offsets (tl.multiple_of), so that gathered rows load as vectors (FP8 attention
    rows of 584 bytes: 8; indexer keys of 132 bytes: 4)."""
    return math.gcd(16, *strides)
