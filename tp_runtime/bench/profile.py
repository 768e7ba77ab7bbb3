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


# ------------------------------------------------------------------ the profile view (bench.profile=true)

# Where a kernel's GPU time goes: the first marker found walking the launching op's Python stack from
# the innermost frame out (frames read "path(line): function"). GEMM ops launched from model/layers.py,
# and the FP8 GEMM kernel, are weight GEMMs; copy kernels are copies wherever they come from.
GROUP_MARKERS = (
    ("all-reduce", ("all_reduce",)),
    ("indexer", ("indexer_topk", "indexer.py(")),
    ("compressors", ("compressor.py(",)),
    ("norms and rotary", ("rms_norm", "rope.py(")),
    ("attention", ("sparse_attention", "attention.py(")),
    ("step index", ("step_index.py(", "buffers.py(")),
)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul")
GROUPS = ("weight GEMMs", *(g for g, _ in GROUP_MARKERS), "copies", "other")


def kernel_group(op: str, stack: list[str], kernel: str) -> str:
    """The group of one kernel launched by CPU op `op` with Python stack `stack` (innermost first)."""
    if kernel.startswith(COPY_PREFIXES) or "copy" in kernel.lower():
        return "copies"
    if "fp8_linear" in kernel or (op in GEMM_OPS and any("model/layers.py(" in f for f in stack)):
        return "weight GEMMs"
    for frame in stack:
        for group, markers in GROUP_MARKERS:
            if any(m in frame for m in markers):
                return group
    return "other"


def profile_view(run: Callable[[], None], n_steps: int, trace: str | None) -> dict[str, float]:
    """Run `run` (n_steps eager steps of the lane's path) under the profiler with Python stacks; write a
    Chrome / Perfetto trace to `trace` (if given); return GPU ms per step by group (GROUPS) and in all."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        run()
        torch.cuda.synchronize()
    if trace is not None:
        prof.export_chrome_trace(trace)
    ms = dict.fromkeys(GROUPS, 0.0)
    for e in prof.events():
        for k in getattr(e, "kernels", []) if e.device_type == DeviceType.CPU else []:
            ms[kernel_group(e.name, e.stack or [], k.name)] += k.duration / 1e3 / n_steps
    ms["total"] = sum(ms.values())
    return ms


def view_table(rows: list[dict]) -> str:
    """Rows {lane, batch, context, <group>: ms} -> a text table, one line per lane and point."""
    head = f"{'lane':<22} {'batch':>5} {'ctx':>6} " + " ".join(f"{g[:12]:>12}" for g in GROUPS) + f" {'total':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['lane']:<22} {r['batch']:>5} {r['context']:>6} "
                     + " ".join(f"{r[g]:12.3f}" for g in GROUPS) + f" {r['total']:8.3f}")
    return "\n".join(lines)
