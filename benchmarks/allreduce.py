"""All-reduce latency and bus bandwidth from 8 KB to 64 MB, eager and inside a CUDA graph.

    python benchmarks/allreduce.py --nproc 2                      # ranks started by the elastic agent
    torchrun --nproc-per-node 4 benchmarks/allreduce.py           # ranks started by torchrun
    python benchmarks/allreduce.py --nproc 2 --device cpu         # gloo on CPU: the eager half only

Message = a 1-D tensor of the given bytes in --dtype. Latency: median over --iters all-reduces, by CUDA
events (GPU) or perf_counter (CPU); in-graph: --iters all-reduces captured in one CUDA graph, median
replay time / iters. Bus bandwidth = bytes / latency * 2 (n - 1) / n (the bytes each link carries in a
ring all-reduce). Prints a table, writes <output>/allreduce_<device>_<n>ranks.json, ends with a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from tp_runtime.bench.measure import allreduce_ms
from tp_runtime.engine.shard import DTYPES
from tp_runtime.parallel.group import init_from_env, shutdown


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes inclusive."""
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 2
    return out


def bus_GBps(nbytes: int, ms: float | None, ranks: int) -> float | None:
    if not ms:
        return None
    return nbytes / (ms * 1e-3) * 2 * (ranks - 1) / ranks / 1e9


def allreduce_entry(opts: dict) -> dict | None:
    """Every rank: join the group, time each size; rank 0 returns the result."""
    tp = init_from_env(opts["device"], "auto", opts["timeout_s"])
    try:
        dtype = DTYPES[opts["dtype"]]
        allreduce_ms(tp, (1024,), dtype, 3)  # untimed: connection set-up and lazy initialisation
        rows = []
        for nbytes in sizes(opts["min_bytes"], opts["max_bytes"]):
            numel = max(1, nbytes // dtype.itemsize)
            t = allreduce_ms(tp, (numel,), dtype, opts["iters"])
            eager, graph = t["allreduce_ms_eager"], t["allreduce_ms_graph"]
            rows.append({"bytes": numel * dtype.itemsize, "eager_us": eager * 1e3,
                         "eager_bus_GBps": bus_GBps(numel * dtype.itemsize, eager, tp.size),
                         "graph_us": None if graph is None else graph * 1e3,
                         "graph_bus_GBps": bus_GBps(numel * dtype.itemsize, graph, tp.size)})
        if tp.rank != 0:
            return None
        dev = tp.device
        return {"command": "allreduce", "ranks": tp.size, "device": str(dev), "dtype": opts["dtype"],
                "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "backend": "nccl" if dev.type == "cuda" else "gloo", "torch": torch.__version__,
                "host": platform.node(), "iters": opts["iters"],
                "timer": "cuda_events" if dev.type == "cuda" else "perf_counter (CPU host clock)",
                "graph": ("captured: iters all-reduces in one CUDA graph" if dev.type == "cuda"
                          else "skipped: CUDA graphs need GPUs (gloo on CPU runs the eager half only)"),
                "rows": rows}
    finally:
        shutdown(tp)


def _fmt(x: float | None, width: int, prec: int) -> str:
    return "-".rjust(width) if x is None else f"{x:>{width}.{prec}f}"


def print_result(res: dict) -> None:
    print(f"all-reduce: {res['ranks']} ranks, {res['backend']} on {res['device_name']}, {res['dtype']}, "
          f"median of {res['iters']} ({res['timer']}); graph {res['graph']}")
    print(f"{'bytes':>10} {'eager us':>10} {'eager GB/s':>11} {'graph us':>10} {'graph GB/s':>11}")
    for r in res["rows"]:
        print(f"{r['bytes']:>10} {r['eager_us']:>10.1f} {_fmt(r['eager_bus_GBps'], 11, 2)} "
              f"{_fmt(r['graph_us'], 10, 1)} {_fmt(r['graph_bus_GBps'], 11, 2)}")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--min-bytes", type=int, default=8 << 10)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--timeout-s", type=float, default=120.0, help="a rank stuck this long fails the run")
    p.add_argument("--output", default="out/bench/allreduce")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.nproc < 2 and "RANK" not in os.environ:
        print("error: --nproc must be >= 2 (an all-reduce needs two ranks)", file=sys.stderr)
        return 2
    opts = {"device": a.device, "dtype": a.dtype, "iters": a.iters, "min_bytes": a.min_bytes,
            "max_bytes": a.max_bytes, "timeout_s": a.timeout_s}
    if "RANK" in os.environ:  # torchrun started this process
        res = allreduce_entry(opts)
    else:
        from tp_runtime.parallel.errors import LaunchError
        from tp_runtime.parallel.launcher import run_elastic

        try:
            res = run_elastic(a.nproc, allreduce_entry, (opts,))
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if res is None:
        return 0
    out = Path(a.output) / f"allreduce_{res['device'].split(':')[0]}_{res['ranks']}ranks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print_result(res)
    print(json.dumps({**res, "file": str(out)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
