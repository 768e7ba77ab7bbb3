"""Where a step's GPU time goes, from the torch profiler (CUPTI): kernels per step and GPU busy time.

Measured on separate, untimed steps (profiling slows the host), so every record can show how far its
timed step is from its own GPU time: `step_ms_median / gpu_busy_ms` near 1 means the GPU is the bound;
far above 1, the host (launches, Python, synchronization).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

COPY_PREFIXES = ("Memcpy", "Memset")  # device copies and fills, counted apart from kernels


def profile_steps(run: Callable[[], None], n_steps: int, device: torch.device) -> dict:
    """Run `run` (n_steps steps) under the profiler; per step: device activities, kernels, and the sum of
    their durations (GPU busy ms; overlapping kernels counted each). None on a CPU."""
    if device.type != "cuda" or n_steps == 0:
        return {"kernels_per_step": None, "copies_per_step": None, "gpu_busy_ms": None}
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    acts = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    copies = [e for e in acts if e.name.startswith(COPY_PREFIXES)]
    busy_us = sum(e.time_range.elapsed_us() for e in acts)
    return {"kernels_per_step": (len(acts) - len(copies)) / n_steps, "copies_per_step": len(copies) / n_steps,
            "gpu_busy_ms": busy_us / 1e3 / n_steps}
