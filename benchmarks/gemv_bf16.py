"""The Triton skinny GEMM (ops/gemv.py) against cuBLAS at the decode shapes of bf16 weights, inside CUDA graphs.

    python -m benchmarks.gemv_bf16 --out OUT.jsonl [--model v4_flash] [--tp 1 2 4 8] [--m 1 2 4 8 16 32] [--sweep]

Shapes (N, K) of one rank at each tp: wx, the fused x projection of each layer kind (ratio 0 / 128 / 4:
model/attention.py x_projections; K = hidden; behind attn_norm), and with FP8 weights its bf16 part (the
projections the checkpoint holds in bf16: model/attention.py x_gemms; x normed by the kernel before), wq_b
(H*D/tp x Rq, behind q_norm), the indexer's wq_b (Ih*Id x Rq, behind q_norm), wo_b (hidden x G*Ro/tp,
row-parallel, no norm). Replicated
shapes are timed once and listed under every tp.

Variants per shape and M: cublas (F.linear), triton (`gemv`), triton_pdl (`gemv(pdl=True)`: successive
calls overlap their launch and prologue); for the shapes behind a norm also cublas_norm (ops/rms_norm.py's
kernel, then F.linear: the unfused path of the Triton backend today), triton_norm and triton_norm_pdl (the
norm as `gemv`'s prologue). Each is timed as one CUDA graph of `--calls` calls (at least 50), cycling over
enough copies of the weight to exceed twice the L2 (every call streams its weight from HBM): the median of
20 replays (CUDA events) over the calls. GB/s = weight bytes / time; ratio = Triton time / cuBLAS time
(< 1: Triton faster; the norm variants against cublas_norm). --sweep also times a few kernel
configurations per shape and M (without the norm) and prints the best.

Prints a table, then one JSON line (the record); writes the record to --out (bench/record_file.py). The record's
`suggested` holds the tables of ops/gemv.py (TRITON_GEMV_MAX_M, TRITON_GEMV_NORM_MAX_M) these numbers imply: per
(N, K), the largest measured M up to which every measured M ran faster on Triton without PDL.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from tp_runtime.bench.record_file import write_records
from tp_runtime.config import load_config
from tp_runtime.graph_timer import graph_timing, time_calls
from tp_runtime.model.attention import x_gemms, x_projections
from tp_runtime.ops.gemv import GemvConfig, gemv, gemv_config
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.ops.linear import k_splits
from tp_runtime.ops.rms_norm import rms_norm

ROOT = Path(__file__).resolve().parents[1]
EPS = 1e-6
# --sweep: (block_n, block_k, num_warps, num_stages, programs per SM) of the fma kernel (M = 1) and of the dot kernel
FMA_SWEEP = [(16, 512, 4, 3, 8), (8, 512, 4, 3, 8), (32, 256, 4, 3, 8), (16, 1024, 8, 3, 8), (16, 512, 4, 3, 4),
             (16, 512, 4, 3, 16), (32, 512, 8, 3, 8)]
DOT_SWEEP = [(64, 128, 4, 3, 3), (64, 128, 4, 4, 2), (32, 128, 4, 3, 4), (128, 128, 8, 3, 2), (64, 256, 4, 3, 2),
             (64, 64, 4, 4, 4), (32, 256, 4, 3, 4), (128, 64, 4, 4, 2)]


def shapes(model: str, tp: int) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, behind a norm) of one rank's decode GEMMs at this tp."""
    m = load_config(ROOT / "configs" / f"{model}.yaml").model
    H, D, G, Rq, Ro, hid = m.num_attention_heads, m.head_dim, m.o_groups, m.q_lora_rank, m.o_lora_rank, m.hidden_size
    out = {f"wx r{r}": (sum(w for _, w in x_projections(m, r)), hid, True) for r in (0, 128, 4)}
    for r in (128, 4):  # with FP8 weights: the projections of x the checkpoint holds in bf16, one GEMM (no norm)
        (rows,) = [rows for _, fp8, rows in x_gemms(m, r, fp8=True) if not fp8]
        out[f"wx r{r} bf16 part"] = (sum(w for _, w in rows), hid, False)
    out.update({"wq_b": (H * D // tp, Rq, True), "indexer.wq_b": (m.index_n_heads * m.index_head_dim, Rq, True),
                "wo_b": (hid, G * Ro // tp, False)})
    return out


DEV = torch.device("cuda")


def graph_us(call, weights: list[torch.Tensor], calls: int) -> float:
    """Per-call us of call(w) captured `calls` times in one graph, cycling over `weights` (median of 20
    replays after 3)."""
    for w in weights:  # compile, make split-K counters, warm: outside the capture
        call(w)
    cycle = itertools.cycle(weights)
    return graph_timing(lambda: call(next(cycle)), DEV, calls=calls, warmup=3, replays=20).median_ms * 1e3


def read_bandwidth() -> float:
    x = torch.ones(2**28, device=DEV)  # 1 GiB fp32
    return x.numel() * 4 / (time_calls(lambda: x.sum(), DEV, warmup=3, repeats=20).median_ms * 1e-3)


def variants(x: torch.Tensor, g: torch.Tensor | None) -> dict:
    """name -> call(w) of each variant timed for this x (and norm weight g, where the shape has a norm)."""
    out = {"cublas": lambda w: F.linear(x, w), "triton": lambda w: gemv(x, w),
           "triton_pdl": lambda w: gemv(x, w, pdl=True)}
    if g is not None:
        out.update({"cublas_norm": lambda w: F.linear(rms_norm(x, g, EPS), w),
                    "triton_norm": lambda w: gemv(x, w, g, EPS),
                    "triton_norm_pdl": lambda w: gemv(x, w, g, EPS, pdl=True)})
    return out


def sweep_configs(m: int, n: int, k: int, n_sm: int) -> list[GemvConfig]:
    if m == 1:
        return [GemvConfig(False, 1, bn, bk, wp, st, k_splits(1, n, k, bn, bk, n_sm, per_sm=ps))
                for bn, bk, wp, st, ps in FMA_SWEEP]
    bm = min(32, max(16, 1 << (m - 1).bit_length()))
    return [GemvConfig(True, bm, bn, bk, wp, st, k_splits(m, n, k, bn, bk, n_sm, block_m=bm, per_sm=ps))
            for bn, bk, wp, st, ps in DOT_SWEEP]


def bench_shape(n: int, k: int, norm: bool, ms: list[int], calls: int, sweep: bool) -> list[dict]:
    """One row per M: us, GB/s and ratios of every variant (and the sweep's configurations)."""
    gen = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    nbytes = n * k * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(1, -(-2 * l2 // nbytes))
    weights = [(torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
    gw = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16) if norm else None
    n_calls = max(calls, copies)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        us = {name: graph_us(fn, weights, n_calls) for name, fn in variants(x, gw).items()}
        row = {"N": n, "K": k, "M": m, "norm": norm, "weight_MB": nbytes / 1e6,
               "config": gemv_config(m, n, k, sm_count(x.device))._asdict(), "us": us,
               "GBps": {v: nbytes / (t * 1e-6) / 1e9 for v, t in us.items()},
               "ratio": {v: t / us["cublas_norm" if "norm" in v else "cublas"] for v, t in us.items()
                         if v.startswith("triton")}}
        if sweep:
            timed = [(graph_us(lambda w, c=c: gemv(x, w, config=c), weights, n_calls), c)
                     for c in sweep_configs(m, n, k, sm_count(x.device))]
            row["sweep"] = [{"us": t, **c._asdict()} for t, c in sorted(timed, key=lambda tc: tc[0])]
        rows.append(row)
    del weights
    torch.cuda.empty_cache()
    return rows


def suggested(rows: list[dict], variant: str, against: str) -> dict[str, int]:
    """'N,K' -> the largest measured M up to which `variant` beat `against` at every measured M (0: none)."""
    out: dict[str, int] = {}
    for key in sorted({(r["N"], r["K"]) for r in rows if variant in r["us"]}):
        best = 0
        for r in sorted((r for r in rows if (r["N"], r["K"]) == key and variant in r["us"]), key=lambda r: r["M"]):
            if r["us"][variant] >= r["us"][against]:
                break
            best = r["M"]
        out[f"{key[0]},{key[1]}"] = best
    return out


def print_row(tps: list[int], name: str, r: dict) -> None:
    us, gb, ra = r["us"], r["GBps"], r["ratio"]
    line = (f"{','.join(map(str, tps)):>8s} {name:13s} {r['N']:6d} {r['K']:5d} {r['M']:3d} "
            f"{us['cublas']:7.1f} {gb['cublas']:5.0f} {us['triton']:7.1f} {gb['triton']:5.0f} {ra['triton']:5.2f} "
            f"{ra['triton_pdl']:5.2f}")
    if r["norm"]:
        line += (f" | {us['cublas_norm']:7.1f} {us['triton_norm']:7.1f} {ra['triton_norm']:5.2f} "
                 f"{ra['triton_norm_pdl']:5.2f}")
    print(line)
    for s in r.get("sweep", [])[:3]:
        print(f"{'':24s} sweep {s['us']:7.1f} us  dot={s['dot']} bm={s['block_m']} bn={s['block_n']} "
              f"bk={s['block_k']} warps={s['num_warps']} stages={s['num_stages']} splits={s['splits']}")


def _refuse(args: argparse.Namespace) -> str | None:
    """Why the run cannot start (one line), or None."""
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        return f"--out {args.out}: must be a file path in an existing directory"
    if not (ROOT / "configs" / f"{args.model}.yaml").is_file():
        return f"--model {args.model}: no configs/{args.model}.yaml"
    if not torch.cuda.is_available():
        return "benchmarks/gemv_bf16.py needs a CUDA GPU"
    if min(args.m) < 1 or min(args.tp) < 1 or args.calls < 1:
        return "--m, --tp and --calls must be positive"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="path of the JSON record to write")
    p.add_argument("--model", default="v4_flash")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--calls", type=int, default=50, help="calls per graph (at least the weight copies)")
    p.add_argument("--sweep", action="store_true", help="also time kernel configurations (no norm)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    why = _refuse(a)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    m_cfg = load_config(ROOT / "configs" / f"{a.model}.yaml").model
    which: dict[tuple[int, int, bool], tuple[str, list[int]]] = {}  # a shape's first name and its tps
    for tp in a.tp:
        if m_cfg.num_attention_heads % tp or m_cfg.o_groups % tp:
            print(f"error: --tp {tp} does not divide the heads ({m_cfg.num_attention_heads}) and groups "
                  f"({m_cfg.o_groups}) of {a.model}", file=sys.stderr)
            return 2
        for name, shape in shapes(a.model, tp).items():
            which.setdefault(shape, (name, []))[1].append(tp)
    bw = read_bandwidth()
    print(f"read bandwidth {bw / 1e12:.2f} TB/s ({torch.cuda.get_device_name()}, torch {torch.__version__}); us per "
          f"call, GB/s of weight, ratio = Triton / cuBLAS time")
    print(f"{'tp':>8s} {'weight':13s} {'N':>6s} {'K':>5s} {'M':>3s} {'cublas':>7s} {'GB/s':>5s} {'triton':>7s} "
          f"{'GB/s':>5s} {'ratio':>5s} {'pdl':>5s} | {'rms+cub':>7s} {'fused':>7s} {'ratio':>5s} {'pdl':>5s}")
    rows = []
    for (n, k, norm), (name, tps) in which.items():
        for r in bench_shape(n, k, norm, a.m, a.calls, a.sweep):
            r.update(weight=name, tps=tps)
            rows.append(r)
            print_row(tps, name, r)
    rec = {"benchmark": "gemv_bf16", "model": a.model, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": __import__("triton").__version__, "read_GBps": bw / 1e9,
           "calls_per_graph": a.calls, "rows": rows,
           "suggested": {"TRITON_GEMV_MAX_M": suggested(rows, "triton", "cublas"),
                         "TRITON_GEMV_NORM_MAX_M": suggested(rows, "triton_norm", "cublas_norm")}}
    write_records(a.out, [rec], settings=vars(a))
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
