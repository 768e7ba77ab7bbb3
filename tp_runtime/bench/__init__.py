"""Benchmarks: `tp-runtime bench SWEEP` (sweep.py) and, under torchrun, `python -m tp_runtime.bench SWEEP`."""
