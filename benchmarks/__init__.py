"""Benchmark scripts, run from the repository root as `python -m benchmarks.NAME` (see benchmarks/README.md)."""

import sys

import torch


def require_gpu(script: str, what: str) -> None:
    """Exit 2 with one `error:` line (not a traceback from the first CUDA call) where CUDA is not available:
    `script` (its file name) `what` (what it measures) needs a CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"error: {script} {what}: it needs a CUDA GPU, and this machine has none", file=sys.stderr)
        sys.exit(2)
