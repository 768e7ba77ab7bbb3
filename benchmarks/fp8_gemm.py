"""The weight-GEMM kernel (ops/linear.py) against cuBLAS per weight shape: time and share of read bandwidth.

    python -m benchmarks.fp8_gemm [--model v4_flash] [--tp 1] [--out DIR]

Each shape is timed at M = 1, 8, 32, 128 as a CUDA graph of one call per copy of the weight, enough copies
to exceed the 60 MB L2 (so every call streams from HBM, and the host's launch cost is out of the number):
median replay time (CUDA events, 20 replays after 3) / copies. Variants: fp8 (`fp8_linear`, FP8 weights: the
path the model takes at this M, named in the row), bf16_triton (the Triton kernel on the bf16 matrix), bf16
(cuBLAS: torch.bmm over the groups given contiguous), and for wo_a bf16_bmm_strided (`grouped_linear`: one
bmm over strided views of x and the output, what the model runs) and bf16_einsum (the einsum it replaced,
which copies x's groups apart). --sweep also times GEMV configurations at M = 1 and tile-kernel
configurations at M = 8 and 32. Bytes: FP8 values + e8m0 scales, or the bf16 matrix;
share = bytes / time / read bandwidth, the read bandwidth measured here (sum over 1 GiB). Prints a table;
writes fp8_gemm.jsonl (bench/record_file.py's records). The FP8 GEMM family with e4m3 x: fp8_gemm_tune.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

from tp_runtime.bench.measure import bandwidth
from tp_runtime.bench.record_file import write_records
from tp_runtime.config import load_config
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.ops.linear import (LinearConfig, dequantize, fp8_linear, fp8_path, grouped_linear, k_splits,
                                   linear_triton, tile_config)
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import fp8_gemm_shapes

ROOT = Path(__file__).resolve().parents[1]
MS = (1, 8, 32, 128)


DEV = torch.device("cuda")


def _graph_ms(call, items: list) -> float:
    """Per-call ms of call(item) over `items` (copies of a weight) captured back to back in one CUDA graph:
    median of 20 replays after 3 (graph_timer). Each item runs once eagerly first (compiles, split-K counters)."""
    for it in items:
        call(it)
    cycle = itertools.cycle(items)
    return graph_timing(lambda: call(next(cycle)), DEV, calls=len(items), warmup=3, replays=20).median_ms


def shapes(model: str, tp: int) -> dict[str, tuple[int, int, int]]:
    """weight -> (N, K, groups) of each FP8 GEMM one rank of `tp` runs (weights/specs.py)."""
    return fp8_gemm_shapes(load_config(ROOT / "configs" / f"{model}.yaml").model, tp)


def _einsum(x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    m, n = x.shape[0], w.shape[0]
    return torch.einsum("tgd,grd->tgr", x.view(m, groups, -1), w.view(groups, n // groups, -1)).flatten(1)


def gemv_configs(n: int, k: int, n_sm: int) -> list[LinearConfig]:
    """M = 1 configurations swept: rows per program, K step, warps; K split by the kernel's own rule."""
    out = []
    for bn in (8, 16, 32):
        for bk in (256, 512, 1024):
            for warps in (4, 8):
                out.append(LinearConfig(1, bn, bk, warps, 3, k_splits(1, n, k, bn, bk, n_sm)))
    return out


def tile_configs(m: int, n: int, k: int, n_sm: int) -> list[LinearConfig]:
    """Tile-kernel configurations swept at M > 1: weight rows per tile, stages, programs per SM."""
    bm = tile_config(m, n, k, n_sm).block_m
    return [LinearConfig(bm, bn, 128, 4, stages, k_splits(m, n, k, bn, 128, n_sm, block_m=bm, per_sm=per_sm))
            for bn in (64, 128) for stages in (3, 4) for per_sm in (2, 4, 8)]


def bench_shape(n: int, k: int, groups: int, bw: float, sweep: bool) -> list[dict]:
    copies = max(2, int(256e6 // (n * k)) + 1)  # > 4x the L2 in FP8 bytes
    qs = [quantize_fp8(torch.randn(n, k, device="cuda") / k ** 0.5) for _ in range(copies)]
    bfs = [dequantize(q, s, torch.bfloat16) for q, s in qs]
    n_sm = sm_count(torch.device("cuda"))
    rows = []
    for m in MS:
        x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
        xg = x.view(m, groups, k).transpose(0, 1)  # [groups, m, k]: the bf16 side as one bmm
        t = {"fp8": _graph_ms(lambda qs_: fp8_linear(x, *qs_, groups), qs),
             "bf16_triton": _graph_ms(lambda w: linear_triton(x, w, None, groups), bfs),
             "bf16": _graph_ms(lambda w: torch.bmm(xg, w.view(groups, n // groups, k).transpose(1, 2)), bfs)}
        if groups > 1:
            t["bf16_bmm_strided"] = _graph_ms(lambda w: grouped_linear(x, w, groups), bfs)
            t["bf16_einsum"] = _graph_ms(lambda w: _einsum(x, w, groups), bfs)
        nbytes = {"fp8": n * k + qs[0][1].numel(), "bf16": 2 * n * k}
        r = {"N": n, "K": k, "M": m, "path": fp8_path(m, x), "splits": tile_config(m, n, k, n_sm).splits}
        for v, ms in t.items():
            r[f"{v}_us"] = ms * 1e3
            r[f"{v}_share"] = nbytes[v.split("_")[0]] / (ms * 1e-3) / bw
        r["speedup"] = t["bf16"] / t["fp8"]
        if sweep and m in (1, 8, 32):
            configs = gemv_configs(n, k, n_sm) if m == 1 else tile_configs(m, n, k, n_sm)
            r["sweep"] = [dict(c._asdict(),
                               fp8_us=1e3 * _graph_ms(lambda qs_, c=c: linear_triton(x, *qs_, groups, c), qs),
                               bf16_us=1e3 * _graph_ms(lambda w, c=c: linear_triton(x, w, None, groups, c), bfs))
                          for c in configs]
        rows.append(r)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="v4_flash")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--out", default="out/fp8_gemm")
    p.add_argument("--sweep", action="store_true",
                   help="also time GEMV configurations at M = 1 and tile configurations at M = 8, 32")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    bw = bandwidth(DEV, 1024)["read_GBps"] * 1e9
    print(f"read bandwidth {bw / 1e12:.2f} TB/s ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    variants = ("fp8", "bf16_triton", "bf16")
    print(f"{'weight':18s} {'N':>6s} {'K':>6s} {'M':>4s} {'path':>9s} {'S':>3s} " + " ".join(f"{v + ' us':>15s} {'share':>5s}"
                                                                          for v in variants) + f" {'x':>5s}")
    rows = []
    for name, (n, k, groups) in shapes(a.model, a.tp).items():
        for r in bench_shape(n, k, groups, bw, a.sweep):
            r["weight"] = name
            rows.append(r)
            print(f"{name:18s} {n:6d} {k:6d} {r['M']:4d} {r['path']:>9s} {r['splits']:3d} "
                  + " ".join(f"{r[v + '_us']:15.1f} {r[v + '_share']:5.0%}" for v in variants)
                  + f" {r['speedup']:5.2f}"
                  + "".join(f" {v}={r[v + '_us']:.1f}" for v in ("bf16_bmm_strided", "bf16_einsum") if v + "_us" in r))
            for c in r.get("sweep", []):
                print(f"    bm={c['block_m']:3d} bn={c['block_n']:3d} bk={c['block_k']:4d} warps={c['num_warps']} "
                      f"stages={c['num_stages']} splits={c['splits']:3d}: "
                      f"fp8 {c['fp8_us']:6.1f} us, bf16 {c['bf16_us']:6.1f} us")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "fp8_gemm.jsonl", rows, {"model": a.model, "tp": a.tp, "read_GBps": bw / 1e9})
    print(json.dumps({"file": str(out / "fp8_gemm.jsonl"), "read_GBps": bw / 1e9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
