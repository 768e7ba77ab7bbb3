"""Does a CUDA graph keep programmatic dependent launch (PDL) edges? A chain of dependent Triton kernels,
captured with PDL on and off, replayed, timed and profiled.

    python -m benchmarks.pdl_edges [--kernels 200] [--rows 1,132,1056] [--width 512] [--replays 50]

The chain is `--kernels` RMSNorms (ops/rms_norm.py, one program per row), each reading the previous one's
output, captured in one graph per (rows, pdl). Per point:

  us/kernel   replay time over kernels (CUDA events around `--replays` back-to-back replays)
  gap         start of a kernel minus the end of the one before it, from the profiler's trace of one
              replay (CUPTI timestamps, ns resolution): median, p10, p90, min
  overlap     the share of kernels that started before their predecessor ended

With plain launches a kernel starts after its predecessor has ended (gaps > 0). With the edges kept, the
next kernel is launched once its predecessor's programs have triggered, and its programs wait on the GPU
(gdc_wait) for the predecessor to complete, so starts overlap ends (gaps <= 0) and the chain is shorter.
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tp_runtime.graph_timer import capture, time_calls
from tp_runtime.ops.kernel_support import pdl_unavailable
from tp_runtime.ops.rms_norm import rms_norm

DEV = torch.device("cuda")


def chain_graph(x: torch.Tensor, w: torch.Tensor, n: int, pdl: bool) -> torch.cuda.CUDAGraph:
    """n RMSNorms, each of the previous one's output, in one graph (the chain runs once eagerly first:
    compiled before the capture)."""
    def chain() -> None:
        y = x
        for _ in range(n):
            y = rms_norm(y, w, 1e-6, pdl=pdl)

    return capture(chain, x.device)


def replay_us(graph: torch.cuda.CUDAGraph, n_kernels: int, replays: int) -> float:
    """Microseconds per kernel over `replays` back-to-back replays (one warm replay first)."""
    t = time_calls(graph.replay, DEV, warmup=1, repeats=1, inner=replays)
    return t.median_ms * 1e3 / n_kernels


def kernel_spans(graph: torch.cuda.CUDAGraph) -> list[tuple[float, float]]:
    """(start, end) in us of every kernel of one replay, in start order, from the profiler's Chrome trace
    (its timestamps keep fractions of a microsecond, the event list's do not)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("cat") == "kernel")
    return spans


def gap_stats(spans: list[tuple[float, float]]) -> dict:
    gaps = sorted(b[0] - a[1] for a, b in zip(spans, spans[1:]))
    if not gaps:
        return {"kernels_seen": len(spans)}

    def q(f: float) -> float:
        return round(gaps[min(len(gaps) - 1, int(f * len(gaps)))], 3)

    return {"kernels_seen": len(spans), "gap_us_median": q(0.5), "gap_us_p10": q(0.1), "gap_us_p90": q(0.9),
            "gap_us_min": round(gaps[0], 3), "overlap_share": round(sum(g < 0 for g in gaps) / len(gaps), 3)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=200, help="dependent launches per graph")
    ap.add_argument("--rows", default="1,132,1056", help="rows of the normed tensor = programs per kernel")
    ap.add_argument("--width", type=int, default=512, help="elements of a row")
    ap.add_argument("--replays", type=int, default=50)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks/pdl_edges.py needs a CUDA GPU", file=sys.stderr)
        return 2
    why = pdl_unavailable(DEV)
    if why:
        print(f"error: PDL needs {why}", file=sys.stderr)
        return 2
    w = torch.ones(args.width, device=DEV, dtype=torch.bfloat16)
    points = []
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, args.width, device=DEV, dtype=torch.bfloat16)
        graphs = {pdl: chain_graph(x, w, args.kernels, pdl) for pdl in (False, True)}
        for pdl, graph in graphs.items():
            us = min(replay_us(graph, args.kernels, args.replays) for _ in range(3))
            points.append({"rows": rows, "pdl": pdl, "us_per_kernel": round(us, 3), **gap_stats(kernel_spans(graph))})
    print(f"{'rows':>6} {'pdl':>5} {'us/kernel':>10} {'gap med':>8} {'p10':>7} {'p90':>7} {'min':>7} {'overlap':>8}")
    for p in points:
        print(f"{p['rows']:>6} {str(p['pdl']):>5} {p['us_per_kernel']:>10.3f} "
              f"{p.get('gap_us_median', float('nan')):>8.3f} "
              f"{p.get('gap_us_p10', float('nan')):>7.3f} {p.get('gap_us_p90', float('nan')):>7.3f} "
              f"{p.get('gap_us_min', float('nan')):>7.3f} {p.get('overlap_share', float('nan')):>8.3f}")
    print(json.dumps({"benchmark": "pdl_edges", "kernels": args.kernels, "width": args.width,
                      "device": torch.cuda.get_device_name(DEV), "points": points}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
