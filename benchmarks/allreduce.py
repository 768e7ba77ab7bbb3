"""All-reduce latency and bus bandwidth, NCCL against torch's symmetric-memory one-shot and two-shot kernels
(parallel/allreduce.py), 8 KB to 4 MB, eager and inside a CUDA graph.

    torchrun --nproc-per-node 2 -m benchmarks.allreduce --out DIR     # ranks started by torchrun (2 or 4)
    python -m benchmarks.allreduce --nproc 4 --out DIR                 # ranks started by the elastic agent
    python -m benchmarks.allreduce --nproc 2 --device cpu              # gloo on CPU: NCCL's column, eager only

Message = a 1-D tensor of the given bytes in --dtype (bf16 by default). Each path is the group's all-reduce
set up as the runtime sets it up (setup_allreduce with parallel.allreduce=nccl | symm_one_shot |
symm_two_shot, its buffer sized for the largest message); a path that cannot run here is recorded as
skipped with the reason. Latency: median over --iters calls, by CUDA events (GPU) or perf_counter (CPU),
after 3 untimed calls; in-graph: --iters calls captured back to back in one CUDA graph, median replay time
/ iters (one warm replay excluded). Bus bandwidth = bytes / latency * 2 (n - 1) / n (what each link carries in
a ring all-reduce). Prints a table, writes <out>/allreduce_<device>_<n>ranks.jsonl (bench/record_file.py), ends
with a JSON line.
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
from tp_runtime.bench.record_file import write_records
from tp_runtime.executor.shard import DTYPES
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


PATHS = ("nccl", "symm_one_shot", "symm_two_shot")
COLUMNS = {"nccl": "", "symm_one_shot": "one_shot_", "symm_two_shot": "two_shot_"}  # row key prefix per path


def _time_path(tp, path: str, dtype: torch.dtype, opts: dict) -> tuple[list[dict] | None, str]:
    """Rows of one path at every size, or (None, why it was skipped). Collective: every rank, same order."""
    from tp_runtime.parallel.allreduce import AllReduceError, setup_allreduce

    try:
        group = setup_allreduce(tp, path, opts["max_bytes"], dtype, opts["timeout_s"])
    except AllReduceError as e:
        return None, f"skipped: {e}"
    rows = []
    for nbytes in sizes(opts["min_bytes"], opts["max_bytes"]):
        numel = max(1, nbytes // dtype.itemsize)
        t = allreduce_ms(group, (numel,), dtype, opts["iters"])
        rows.append({"bytes": numel * dtype.itemsize, "eager_ms": t["allreduce_ms_eager"],
                     "graph_ms": t["allreduce_ms_graph"], "took": t["allreduce_ms_path"]})
    return rows, group.allreduce.label()


def _row(nbytes: int, per_path: dict[str, list[dict] | None], ranks: int) -> dict:
    """One table row: every path's eager and in-graph microseconds and bus GB/s at nbytes."""
    row = {"bytes": nbytes}
    for path, rows in per_path.items():
        r = next((x for x in rows or [] if x["bytes"] == nbytes), None)
        pre = COLUMNS[path]
        eager, graph = (r["eager_ms"], r["graph_ms"]) if r else (None, None)
        row.update({f"{pre}eager_us": None if eager is None else eager * 1e3,
                    f"{pre}eager_bus_GBps": bus_GBps(nbytes, eager, ranks),
                    f"{pre}graph_us": None if graph is None else graph * 1e3,
                    f"{pre}graph_bus_GBps": bus_GBps(nbytes, graph, ranks)})
        if r and r["took"] != path and path != "nccl":  # a message the path does not take (dtype, alignment)
            row[f"{pre}took"] = r["took"]
    return row


def allreduce_entry(opts: dict) -> dict | None:
    """Every rank: join the group, time every path at every size; rank 0 returns the result."""
    tp = init_from_env(opts["device"], "auto", opts["timeout_s"])
    try:
        dtype = DTYPES[opts["dtype"]]
        allreduce_ms(tp, (1024,), dtype, 3)  # untimed: connection set-up and lazy initialisation
        per_path, notes = {}, {}
        for path in PATHS:
            per_path[path], notes[path] = _time_path(tp, path, dtype, opts)
        nccl_sizes = [r["bytes"] for r in per_path["nccl"]]
        rows = [_row(n, per_path, tp.size) for n in nccl_sizes]
        if tp.rank != 0:
            return None
        dev = tp.device
        return {"command": "allreduce", "ranks": tp.size, "device": str(dev), "dtype": opts["dtype"],
                "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "backend": "nccl" if dev.type == "cuda" else "gloo", "torch": torch.__version__,
                "host": platform.node(), "iters": opts["iters"], "paths": notes,
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
    for path, note in res["paths"].items():
        print(f"  {path}: {note}")
    heads = [f"{name} {kind}" for name in ("nccl", "1shot", "2shot") for kind in ("eager", "graph")]
    print(f"{'bytes':>10} " + " ".join(f"{h + ' us':>13}" for h in heads) + f" {'graph GB/s nccl/1/2':>22}")
    for r in res["rows"]:
        us = [r.get(f"{pre}{kind}_us") for pre in COLUMNS.values() for kind in ("eager", "graph")]
        bw = "/".join("-" if r.get(f"{pre}graph_bus_GBps") is None else f"{r[f'{pre}graph_bus_GBps']:.0f}"
                      for pre in COLUMNS.values())
        print(f"{r['bytes']:>10} " + " ".join(_fmt(u, 13, 1) for u in us) + f" {bw:>22}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--min-bytes", type=int, default=8 << 10)
    p.add_argument("--max-bytes", type=int, default=4 << 20)
    p.add_argument("--timeout-s", type=float, default=120.0, help="a rank stuck this long fails the run")
    p.add_argument("--out", "--output", dest="output", default="out/bench/allreduce")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
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
    out = write_records(Path(a.output) / f"allreduce_{res['device'].split(':')[0]}_{res['ranks']}ranks.jsonl",
                        [res], settings=vars(a))
    print_result(res)
    print(json.dumps({**res, "file": str(out)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
