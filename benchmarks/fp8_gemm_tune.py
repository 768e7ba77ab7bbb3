"""Tunes the FP8 GEMM family (ops/fp8_gemm.py) on this GPU: for every FP8 weight one rank holds in the Flash and
Pro stacks at tp 1, 2, 4 and 8, and every M bucket of ops/fp8_gemm_table.py, times the candidate launches (tile
sizes, stages, warps, K splits, x rounded in the prologue or by one quantize launch, the two Gluon kernels from
M = 8 (one set of warps, or warp-specialized), the GEMV at M = 1, cuBLASLt's block-scaled GEMM) and writes the
fastest into the table the Triton backend reads.

    python -m benchmarks.fp8_gemm_tune [--models v4_flash v4_pro] [--tp 1 8 2 4] [--budget-s 420] [--out DIR]
                                       [--merge TABLE [--only-missing]] [--buckets 1 2 ...] [--jobs N]
    python -m benchmarks.fp8_gemm_tune --repick RUN/fp8_gemm_tune.jsonl.gz --merge TABLE --out DIR   (no GPU)

Each launch is timed as a CUDA graph of one call per copy of the weight, enough copies to exceed the L2 several
times (every call streams its weight from HBM, as in a step; the host's launch cost is out of the number): the
median over replays (CUDA events) / copies, launched without PDL (copies of one GEMM under PDL overlap each other
more than a step's kernels overlap a GEMM: launches chosen so measured 0.3-2 % slower in a step). Before any
timing, the candidate launches compile in --jobs processes (Triton's on-disk cache then serves the timing
process; compiling dominates a tune otherwise). Beside the table's choice each record holds the time of the GEMM
on x as given (ops/linear.py: GEMV or tile kernel) and of cuBLAS on the bf16 weight, and each time's share of the
read bandwidth (FP8 values + scales, or the bf16 matrix, over the time, over a 1 GiB read measured here).
The winner of each (shape, bucket) is the fastest, a launch that needs a quantize launch first charged 0.5 us
(EXTRA_LAUNCH_MS), and is checked against the torch twin. Writes DIR/fp8_gemm_table.json (copy it
to tp_runtime/ops/), DIR/fp8_gemm_measured.jsonl (each winner with its reference times) and
DIR/fp8_gemm_tune.jsonl (every timing), their records led by bench/record_file.py's common header. With
--merge TABLE the written table also holds TABLE's entries for the shapes and M buckets not tuned in this run.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from tp_runtime.bench.measure import bandwidth
from tp_runtime.bench.record_file import record_header, write_records
from tp_runtime.config import load_config
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops.fp8_gemm import Fp8GemmConfig, fp8_gemm, fp8_gemm_torch
from tp_runtime.ops.fp8_gemm_table import M_BUCKETS, Fp8GemmTable, shape_key
from tp_runtime.ops.fp8_gemm_wgmma import WS_MAX_TILE
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.ops.linear import blockwise_scaled_mm_available, grouped_linear, k_splits, linear_triton
from tp_runtime.paths import write_text_atomic
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import fp8_gemm_shapes

ROOT = Path(__file__).resolve().parents[1]
L2_BYTES = 50 << 20
TOL = 4e-3  # the same exact products summed in another fp32 order, each output rounded to bf16 (2^-9)
# What a launch that rounds x by a separate quantize launch first is charged, in ms, when the winner is picked:
# the graph here runs it back to back without PDL, where a step's chain of PDL launches overlaps each kernel
# boundary by ~0.5 us (KERNELS.md: 1.27 -> 0.77 us at 132 programs), so one more launch costs the step more
# than it costs here. Measured: Gluon launches that won by 0.1 us at M = 8 made rank 0 of tp 8 1.6 % slower.
EXTRA_LAUNCH_MS = 0.5e-3


# The GEMV's (rows, K step, warps): its fp32 product tile, rows x K step, at most 64 registers a thread.
GEMV_TILES = [(bn, bk, w) for bn in (16, 32, 64) for bk in (256, 512, 1024) for w in (4, 8) if bn * bk <= 64 * 32 * w]


def extra_launches(c: Fp8GemmConfig) -> int:
    """Launches the GEMM takes besides its own: one quantize launch unless x is rounded inside the kernel."""
    return 0 if c.kernel == "gemv" or (c.kernel == "triton" and c.quant_x) else 1


def pick(timed: list[tuple[float, Fp8GemmConfig]]) -> tuple[float, Fp8GemmConfig]:
    """The winner among (ms, launch) pairs: the least time, each extra launch charged EXTRA_LAUNCH_MS."""
    return min(timed, key=lambda t: t[0] + EXTRA_LAUNCH_MS * extra_launches(t[1]))


def weight_shapes(model: str, tp: int) -> dict[str, tuple[int, int, int]]:
    """weight -> (N, K, groups) of each FP8 GEMM one rank of `tp` runs (weights/specs.py)."""
    return fp8_gemm_shapes(load_config(ROOT / "configs" / f"{model}.yaml").model, tp)


def mma_splits(bucket: int, n: int, kb: int, bm: int, bn: int, n_sm: int) -> list[int]:
    """K splits an MMA launch of bm x bn tiles is tried with over kb K blocks: none, enough for about one
    program per SM, and twice that, at least 2 K blocks a split."""
    tiles = math.ceil(n / bn) * math.ceil(bucket / bm)
    base = max(1, min(math.ceil(n_sm / tiles), kb // 2))
    return sorted({s for s in (1, base, 2 * base) if s == 1 or s <= kb // 2})


def candidates(bucket: int, n: int, k: int, groups: int, n_sm: int, cublas: bool) -> list[Fp8GemmConfig]:
    """The launches tried at M = bucket."""
    kb, out = k // 128, []
    if bucket == 1 and k % 128 == 0:  # the GEMV: rows x K step x warps, K split to ~2, 4 or 8 programs per SM
        for bn, bk, warps in GEMV_TILES:
            for s in sorted({k_splits(1, n, k, bn, bk, n_sm, per_sm=p) for p in (2, 4, 8)}):
                out.append(Fp8GemmConfig("gemv", 1, bn, s, warps, 3, True, bk))
    for bm in ([max(16, bucket)] if bucket <= 64 else [64, 128]):  # M tiles of one weight tile run together
        for bn in (64, 128):
            if (n // groups) % bn:
                continue
            splits = mma_splits(bucket, n, kb, bm, bn, n_sm)
            for warps in ((4,) if bm <= 32 else (4, 8)):
                for stages in ((4, 6) if bm <= 32 else (3, 4)):
                    for quant in (True, False):
                        out += [Fp8GemmConfig("triton", bm, bn, s, warps, stages, quant) for s in splits]
    if bucket >= 8 and k % 128 == 0:  # (at M = 1 they measured 1.06-1.54x the best launch of every Flash weight)
        out += wgmma_candidates(bucket, n, k, groups, n_sm) + wgmma_ws_candidates(bucket, n, k, groups, n_sm)
    if cublas and groups == 1 and bucket >= 8:
        out.append(Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False))
    return out


def wgmma_candidates(bucket: int, n: int, k: int, groups: int, n_sm: int) -> list[Fp8GemmConfig]:
    """The Gluon kernel's launches at M = bucket: tiles with one MMA in flight (three fp32 tiles: up to 64 x 64
    per warpgroup), and larger tiles that wait for each MMA; as many stages as ~200 KB of shared memory holds,
    and the Triton kernel's K splits."""
    narrow = max(16, min(bucket, 64))  # x rows of the in-flight tiles
    tiles = [(1, narrow, 64, 4), (1, narrow, 128, 8)]
    if narrow <= 32:
        tiles += [(1, narrow, 128, 4), (1, narrow, 256, 8)]
    if bucket >= 64:
        tiles += [(0, 64, 128, 4), (0, 64, 256, 8), (0, 128, 128, 8), (0, 128, 64, 4)]
    out = []
    for in_flight, bm, bn, warps in tiles:
        if (n // groups) % bn:
            continue
        splits = mma_splits(bucket, n, k // 128, bm, bn, n_sm)
        most = min(8, 200 * 1024 // ((bm + bn) * 128))
        for stages in sorted({min(4, most), most}):
            out += [Fp8GemmConfig("wgmma", bm, bn, s, warps, stages, False, in_flight=in_flight) for s in splits]
    return out


def ws_stage_bytes(block_m: int, block_n: int) -> int:
    """Shared memory one stage of the warp-specialized kernel's ring takes: the weight and x tiles (128 e4m3
    columns each) and x's scales, 128 bytes at least (ops/fp8_gemm_wgmma.py stages max(block_m, 32) of them)."""
    return (block_m + block_n) * 128 + 4 * max(block_m, 32)


def wgmma_ws_candidates(bucket: int, n: int, k: int, groups: int, n_sm: int) -> list[Fp8GemmConfig]:
    """The warp-specialized Gluon kernel's launches at M = bucket: x rows up to 128; 64 or 128 weight rows on one
    MMA warpgroup, or 128 or 256 on two (each half), at most WS_MAX_TILE values a warpgroup; as many stages as
    about 110 KB of shared memory holds (two programs an SM, one warpgroup only) or 200 KB (one), and the
    Triton kernel's K splits; 1, 2 or 4 K steps a wait (`ws_k_per_wait`)."""
    out = []
    rows = sorted({max(16, min(bucket, 64)), min(128, max(16, bucket))})
    for bm, (bn, warps) in itertools.product(rows, ((64, 4), (128, 4), (128, 8), (256, 8))):
        if (n // groups) % bn or bn * bm > WS_MAX_TILE * warps // 4:
            continue
        stage = ws_stage_bytes(bm, bn)
        splits = mma_splits(bucket, n, k // 128, bm, bn, n_sm)
        rings = {min(12, 200 * 1024 // stage)} | ({min(8, 110 * 1024 // stage)} if warps == 4 else set())
        for stages in sorted(rings):
            for kpw in ws_k_per_wait(bm, bn, warps, stages):
                out += [Fp8GemmConfig("wgmma_ws", bm, bn, s, warps, stages, False, k_per_wait=kpw) for s in splits]
    return out


def ws_k_per_wait(block_m: int, block_n: int, num_warps: int, stages: int) -> list[int]:
    """K steps a wait the warp-specialized kernel is tried with: 1, 2 and 4 where a warpgroup's accumulator and
    that many products fit three fp32 tiles of WS_MAX_TILE values (its registers) and the ring holds two
    waits' worth of stages."""
    tile = block_n * block_m * 4 // num_warps  # values a warpgroup holds per fp32 tile
    return [k for k in (1, 2, 4) if (k + 1) * tile <= 3 * WS_MAX_TILE and stages >= 2 * k]


DEV = torch.device("cuda")


def graph_ms(call, copies: int) -> float:
    """Per-call ms of call(i) over weight copies i = 0 .. copies-1 captured back to back in one CUDA graph:
    median of 10 replays (graph_timer). Every copy runs once eagerly first: compiles, and makes what a capture
    may not (split-K counters, cuBLASLt's fp32 weight scales)."""
    for i in range(copies):
        call(i)
    cycle = itertools.cycle(range(copies))
    return graph_timing(lambda: call(next(cycle)), DEV, calls=copies, warmup=1, replays=10).median_ms


def tune_shape(n: int, k: int, groups: int, buckets: list[int], bw: float, n_sm: int, log) -> dict[int, dict]:
    """Best launch per M bucket for one weight shape, with its reference times."""
    fp8_bytes = n * k + math.ceil(n / 128) * math.ceil(k / 128)
    copies = max(2, math.ceil(4 * L2_BYTES / fp8_bytes))
    g = torch.Generator(device="cuda").manual_seed(n + 7 * k)
    # weights whose 128 x 128 scales span orders of magnitude, as trained weights' blocks do
    w = torch.randn(n, k, device="cuda", generator=g) * torch.logspace(-2, 1, n, device="cuda")[:, None] / k ** 0.5
    q, s = quantize_fp8(w)
    qs = [(q.clone(), s.clone()) for _ in range(copies)]
    bcopies = max(2, math.ceil(4 * L2_BYTES / (2 * n * k)))
    wb = [w.to(torch.bfloat16) for _ in range(bcopies)]
    del w
    cublas = blockwise_scaled_mm_available(q.device)
    best = {}
    for bucket in buckets:
        x = torch.randn(bucket, groups * k, device="cuda", generator=g).to(torch.bfloat16)
        timed = []
        for c in candidates(bucket, n, k, groups, n_sm, cublas):
            try:
                ms = graph_ms(lambda i, c=c: fp8_gemm(x, qs[i][0], qs[i][1], groups, c), copies)
            except Exception as e:  # noqa: BLE001 (a launch that does not fit this GPU: out of shared memory, ...)
                log({"N": n, "K": k, "groups": groups, "M": bucket, "config": c._asdict(), "error": str(e)[:200]})
                continue
            timed.append((ms, c))
            log({"N": n, "K": k, "groups": groups, "M": bucket, "config": c._asdict(), "ms": ms})
        ms, c = pick(timed)
        exact = graph_ms(lambda i: linear_triton(x, qs[i][0], qs[i][1], groups), copies)
        if groups == 1:
            bf16 = graph_ms(lambda i: torch.nn.functional.linear(x, wb[i]), bcopies)
        else:
            bf16 = graph_ms(lambda i: grouped_linear(x, wb[i], groups), bcopies)
        y = fp8_gemm(x, q, s, groups, c)
        ref = fp8_gemm_torch(x, q, s, groups).float()
        err = float((y.float() - ref).norm() / ref.norm())
        best[bucket] = {"config": c._asdict(), "ms": ms, "bw_share": fp8_bytes / (ms * 1e-3) / bw,
                        "exact_ms": exact, "bf16_cublas_ms": bf16, "bf16_bw_share": 2 * n * k / (bf16 * 1e-3) / bw,
                        "err_vs_twin": err, "ok": err < TOL, "candidates": len(timed)}
        print(f"  N={n:6d} K={k:5d} g={groups:2d} M={bucket:4d}  {ms * 1e3:8.1f} us ({best[bucket]['bw_share']:.0%})"
              f"  exact {exact * 1e3:8.1f}  bf16 {bf16 * 1e3:8.1f} ({best[bucket]['bf16_bw_share']:.0%})  "
              f"{c.kernel} bm{c.block_m} bn{c.block_n} bk{c.block_k} s{c.splits} w{c.num_warps} "
              f"st{c.num_stages} q{int(c.quant_x)} f{c.in_flight} k{c.k_per_wait}  err {err:.1e}", flush=True)
    return best


def compile_bucket(job: tuple[int, int, int, int]) -> int:
    """(N, K, groups, M bucket): run every candidate launch, and the exact-activation kernel, once in this
    process, so that Triton compiles them into its on-disk cache. Returns how many launches ran."""
    n, k, groups, bucket = job
    q, s = quantize_fp8(torch.randn(n, k, device=DEV) / k ** 0.5)
    x = torch.randn(bucket, groups * k, device=DEV).to(torch.bfloat16)
    ran = 0
    for c in candidates(bucket, n, k, groups, sm_count(DEV), blockwise_scaled_mm_available(DEV)):
        try:
            fp8_gemm(x, q, s, groups, c)
            ran += 1
        except Exception:  # noqa: BLE001, S112 (a launch that does not fit: the timing logs it)
            continue
    linear_triton(x, q, s, groups)
    torch.cuda.synchronize()
    return ran


def precompile(shapes: list[tuple[int, int, int]], buckets: list[int], jobs: int) -> None:
    """Compile every candidate of `shapes` at `buckets` in `jobs` processes before the timing."""
    t0, work = time.time(), [(n, k, g, b) for n, k, g in shapes for b in buckets]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        ran = sum(pool.map(compile_bucket, work))
    print(f"compiled: {ran} launches of {len(shapes)} shapes in {jobs} processes, {time.time() - t0:.0f} s", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["v4_flash", "v4_pro"])
    ap.add_argument("--tp", nargs="+", type=int, default=[1, 8, 2, 4])
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new shapes after this long")
    ap.add_argument("--out", type=Path, default=Path("out/fp8_gemm_tune"))
    ap.add_argument("--merge", type=Path, help="a table whose entries the written table keeps for untuned shapes")
    ap.add_argument("--only-missing", action="store_true", help="tune only the shapes the --merge table lacks")
    ap.add_argument("--buckets", nargs="+", type=int, default=list(M_BUCKETS), choices=M_BUCKETS,
                    help="the M buckets to tune (with --merge, the others keep the table's launches)")
    ap.add_argument("--repick", type=Path, help="no timing: pick the winners again from a run's fp8_gemm_tune.jsonl"
                    "(.gz) by the current rule, into the --merge table (needs no GPU)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling the candidates first (1: compile while timing)")
    a = ap.parse_args(argv)
    if sorted(set(a.buckets)) != list(M_BUCKETS) and not a.merge:
        ap.error("--buckets needs --merge: the other buckets' launches come from that table")
    if a.repick and not a.merge:
        ap.error("--repick needs --merge: the table whose entries the picks replace")
    return a


def repick(timings: Path, table: Path) -> tuple[dict, int]:
    """The table's entries with each (shape, bucket) timed in `timings` picked again by `pick`; and how many
    entries changed."""
    opener = gzip.open if timings.suffix == ".gz" else open
    with opener(timings, "rt") as f:
        records = [r for r in map(json.loads, f) if "ms" in r and "config" in r]
    timed: dict[tuple[str, str], list] = {}
    for r in records:
        timed.setdefault((shape_key(r["N"], r["K"], r["groups"]), str(r["M"])), []).append(
            (r["ms"], Fp8GemmConfig(**r["config"])))
    entries = {k: {str(b): c._asdict() for b, c in by.items()} for k, by in Fp8GemmTable.load(table).entries.items()}
    changed = 0
    for (key, bucket), runs in timed.items():
        c = pick(runs)[1]._asdict()
        changed += entries.setdefault(key, {}).get(bucket) != c
        entries[key][bucket] = c
    return entries, changed


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.repick:
        entries, changed = repick(a.repick, a.merge)
        meta = {**json.loads(a.merge.read_text())["meta"], "repicked_from": str(a.repick),
                "repick_command": " ".join(["python -m benchmarks.fp8_gemm_tune", *(argv or sys.argv[1:])])}
        table = {"meta": meta, "entries": entries}
        write_text_atomic(a.out / "fp8_gemm_table.json", json.dumps(table, indent=1) + "\n")
        print(f"{changed} entries picked otherwise from {a.repick}; table written to {a.out}")
        return 0
    n_sm, bw, t0 = sm_count(DEV), bandwidth(DEV, 1024)["read_GBps"] * 1e9, time.time()
    print(f"read bandwidth {bw / 1e12:.2f} TB/s, {n_sm} SMs", flush=True)
    shapes: dict[str, tuple[int, int, int]] = {}
    for tp in a.tp:
        for model in a.models:
            for name, shp in weight_shapes(model, tp).items():
                shapes.setdefault(shape_key(*shp), shp)
    timings: list[dict] = []
    entries = {k: {str(b): c._asdict() for b, c in by.items()} for k, by in Fp8GemmTable.load(a.merge).entries.items()
               } if a.merge else {}
    if a.only_missing:
        shapes = {key: shp for key, shp in shapes.items() if key not in entries}
    if a.jobs > 1 and shapes:
        precompile(list(shapes.values()), a.buckets, a.jobs)
    measured = {}
    for key, (n, k, groups) in shapes.items():
        if time.time() - t0 > a.budget_s:
            print(f"budget spent: {key} and later shapes untuned", flush=True)
            continue
        best = tune_shape(n, k, groups, a.buckets, bw, n_sm, timings.append)
        entries[key] = {**entries.get(key, {}), **{str(b): v["config"] for b, v in best.items()}}
        measured[key] = best
    settings = {"models": a.models, "tp": a.tp, "buckets": a.buckets, "budget_s": a.budget_s,
                "read_bandwidth_TBps": bw / 1e12, "merged_from": str(a.merge) if a.merge else None}
    write_records(a.out / "fp8_gemm_tune.jsonl", timings, settings)
    write_records(a.out / "fp8_gemm_measured.jsonl",
                  [{"shape": key, "M": b, **v} for key, by in measured.items() for b, v in by.items()], settings)
    meta = {**record_header(settings), "date": time.strftime("%Y-%m-%d")}
    write_text_atomic(a.out / "fp8_gemm_table.json", json.dumps({"meta": meta, "entries": entries}, indent=1) + "\n")
    bad = [(k, b) for k, by in measured.items() for b, v in by.items() if not v["ok"]]
    print(f"{len(measured)} shapes tuned in {time.time() - t0:.0f} s ({len(entries)} in the table); {len(bad)} winners "
          f"off their twin: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
