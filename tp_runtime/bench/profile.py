"""Where a step's GPU time goes, from the torch profiler (CUPTI): kernels per step and GPU busy time.

Measured on separate, untimed steps (profiling slows the host), so every record can show how far its
timed step is from its own GPU time: `step_ms_median / gpu_busy_ms` near 1 means the GPU is the bound;
far above 1, the host (launches, Python, synchronization).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

COPY_PREFIXES = ("Memcpy", "Memset")  # device copies and fills, counted apart from kernels


TOP_KERNELS = 12  # kernels (by name) listed per record in gpu_ms_by_kernel


def profile_steps(run: Callable[[], None], n_steps: int, device: torch.device) -> dict:
    """Run `run` (n_steps steps, replayed as timed) under the profiler; per step: device activities,
    kernels, the sum of their durations (GPU busy ms; overlapping kernels counted each), and the kernels
    that took most of it by name (gpu_ms_by_kernel). None on a CPU."""
    if device.type != "cuda" or n_steps == 0:
        return {"kernels_per_step": None, "copies_per_step": None, "gpu_busy_ms": None, "gpu_ms_by_kernel": None}
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    acts = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    copies = [e for e in acts if e.name.startswith(COPY_PREFIXES)]
    busy_us = sum(e.time_range.elapsed_us() for e in acts)
    return {"kernels_per_step": (len(acts) - len(copies)) / n_steps, "copies_per_step": len(copies) / n_steps,
            "gpu_busy_ms": busy_us / 1e3 / n_steps,
            "gpu_ms_by_kernel": by_kernel([(e.name, e.time_range.elapsed_us()) for e in acts], n_steps)}


def by_kernel(durations: list[tuple[str, float]], n_steps: int, top: int = TOP_KERNELS) -> list[dict]:
    """(kernel name, us) of every activity -> the `top` names by total time: launches and GPU ms per step
    each, largest first; the rest summed in one row named "(others)". Names are cut at 100 characters."""
    per: dict[str, list[float]] = {}
    for name, us in durations:
        per.setdefault(name[:100], []).append(us)
    rows = sorted(({"kernel": k, "per_step": len(v) / n_steps, "ms": sum(v) / 1e3 / n_steps} for k, v in per.items()),
                  key=lambda r: -r["ms"])
    rest = rows[top:]
    if rest:
        rows = rows[:top] + [{"kernel": "(others)", "per_step": sum(r["per_step"] for r in rest),
                              "ms": sum(r["ms"] for r in rest)}]
    return rows


# ------------------------------------------------------------------ the profile view (bench.profile=true)

# Where a kernel's GPU time goes: the first marker found walking the Python stack that launched it, from
# the innermost frame out (frames read "path(line): function"). Copy kernels are copies wherever they
# come from; a kernel launched straight from a Linear's forward (model/layers.py) is a weight GEMM.
GROUP_MARKERS = (
    ("all-reduce", ("all_reduce",)),
    ("norms and rotary", ("rms_norm", "rope.py(")),
    ("weight GEMMs", ("ops/linear.py(", "ops/fp8_gemm.py(", "model/layers.py(")),
    ("indexer", ("indexer_topk", "indexer.py(")),
    ("compressors", ("compressor.py(",)),
    ("attention", ("sparse_attention", "attention.py(")),
    ("step index", ("step_index.py(", "buffers.py(")),
)
GROUPS = tuple(g for g, _ in GROUP_MARKERS) + ("copies", "other")


def kernel_group(stack: list[str], kernel: str) -> str:
    """The group of one kernel whose launch ran under Python frames `stack` (innermost first)."""
    if kernel.startswith(COPY_PREFIXES) or "copy" in kernel.lower():
        return "copies"
    for frame in stack:
        for group, markers in GROUP_MARKERS:
            if any(m in frame for m in markers):
                return group
    return "other"


def group_trace(trace: dict, n_steps: int) -> dict[str, float]:
    """GPU ms per step by group from a Chrome trace of the torch profiler (with_stack=True): each kernel
    joined to its launch (the runtime call of the same correlation id), and the launch to the Python
    frames open around it on the launching thread."""
    ev = trace["traceEvents"]
    stacks = _launch_stacks(ev)
    ms = dict.fromkeys(GROUPS, 0.0)
    for k in (e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")):
        stack = stacks.get(k.get("args", {}).get("correlation"), [])
        ms[kernel_group(stack, k["name"])] += k.get("dur", 0.0) / 1e3 / n_steps
    ms["total"] = sum(ms.values())
    return ms


def _launch_stacks(ev: list[dict]) -> dict[int, list[str]]:
    """correlation id -> names of the Python frames open at that launch, innermost first. One sweep in
    time order per thread: frames nest, so the open ones form a stack."""
    out: dict[int, list[str]] = {}
    items = [(e["ts"], 0, e) for e in ev if e.get("cat") == "python_function"]
    items += [(e["ts"], 1, e) for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})]
    open_frames: dict[tuple, list[dict]] = {}
    for ts, kind, e in sorted(items, key=lambda it: (it[0], it[1])):
        stack = open_frames.setdefault((e["pid"], e["tid"]), [])
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0.0) < ts:
            stack.pop()
        if kind == 0:
            stack.append(e)
        else:
            out[e["args"]["correlation"]] = [f["name"] for f in reversed(stack)]
    return out


LAYER_RANGE = re.compile(r"^layer (\d+) ratio (\d+)$")  # model/stack.py's LAYER_RANGE, read back


def kernels_by_layer_kind(trace: dict, n_steps: int) -> dict[str, dict]:
    """Kernels a layer launches, per layer kind (compress ratio), from a Chrome trace of eager steps run with
    the stack's layer ranges on (AttentionStack.annotate_layers). A launch belongs to the layer whose range
    is open around it on the launching thread; its kernel's stream says whether it ran on the main stream
    (the one most kernels of the step ran on: the capture stream) or a side stream. Per kind: layers, kernels
    per layer (in all, main stream, side streams), copies per layer, and `names`: the first such layer's
    kernels in launch order ("side:" before a side stream's); "step" holds what no layer range held (the step
    index, the first attn_norm, the last residual add), per step."""
    ev = trace["traceEvents"]
    ranges = [e for e in ev if e.get("cat") == "user_annotation" and LAYER_RANGE.match(e.get("name", ""))]
    launches = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    owner = _launch_owner(ranges, launches)  # correlation id -> (layer, ratio)
    kernels = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    streams: dict[int, int] = {}
    for k in kernels:
        streams[k.get("args", {}).get("stream")] = streams.get(k.get("args", {}).get("stream"), 0) + 1
    main = max(streams, key=streams.get) if streams else None
    per_layer: dict[tuple[int, int], dict[str, int]] = {}
    names: dict[tuple[int, int], list[tuple[int, str]]] = {}  # layer -> (correlation, name), launch order
    step = {"kernels": 0, "main": 0, "side": 0, "copies": 0}
    for k in kernels:
        corr = k.get("args", {}).get("correlation")
        where = owner.get(corr)
        row = per_layer.setdefault(where, {"kernels": 0, "main": 0, "side": 0, "copies": 0}) if where else step
        if k["cat"] != "kernel":
            row["copies"] += 1
            continue
        on_main = k.get("args", {}).get("stream") == main
        row["kernels"] += 1
        row["main" if on_main else "side"] += 1
        if where:
            names.setdefault(where, []).append((corr, k["name"][:60] if on_main else f"side:{k['name'][:60]}"))
    out: dict[str, dict] = {}
    for ratio in sorted({r for _, r in per_layer}):
        rows = [v for (_, r), v in per_layer.items() if r == ratio]
        first = min(where for where in per_layer if where[1] == ratio)
        n_first = len(names.get(first, [])) // n_steps  # the first step's launches of that layer
        out[str(ratio)] = {"layers": len(rows), **{f: sum(v[f] for v in rows) / len(rows) / n_steps for f in step},
                           "names": [n for _, n in sorted(names.get(first, []))[:n_first]]}
    out["step"] = {f: v / n_steps for f, v in step.items()}
    return out


def _launch_owner(ranges: list[dict], launches: list[dict]) -> dict[int, tuple[int, int]]:
    """correlation id -> (layer, ratio) of the layer range open around the launch on its thread."""
    by_thread: dict[tuple, list[dict]] = {}
    for r in ranges:
        by_thread.setdefault((r["pid"], r["tid"]), []).append(r)
    out = {}
    for e in launches:
        for r in by_thread.get((e["pid"], e["tid"]), ()):
            if r["ts"] <= e["ts"] <= r["ts"] + r.get("dur", 0.0):
                m = LAYER_RANGE.match(r["name"])
                out[e["args"]["correlation"]] = (int(m.group(1)), int(m.group(2)))
                break
    return out


def record_trace(run: Callable[[], None], trace: str | None) -> dict:
    """Run `run` under the profiler with Python stacks; write the Chrome / Perfetto trace to `trace` (None: a
    temporary file) and return it, loaded."""
    import json
    import tempfile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = trace or f"{tmp}/trace.json"
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)


def view_table(rows: list[dict]) -> str:
    """Rows {lane, batch, context, <group>: ms} -> a text table, one line per lane and point."""
    head = f"{'lane':<22} {'batch':>5} {'ctx':>6} " + " ".join(f"{g[:12]:>12}" for g in GROUPS) + f" {'total':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['lane']:<22} {r['batch']:>5} {r['context']:>6} "
                     + " ".join(f"{r[g]:12.3f}" for g in GROUPS) + f" {r['total']:8.3f}")
    return "\n".join(lines)
