"""Sweep the decode sparse-attention kernel's launch configurations at Flash dims (one token per sequence).

    python -m benchmarks.attention_sweep OUT_DIR [--baseline FILE] [--jobs N] [--quick] [--cache bf16|fp8]
                                                 [--batches B ...] [--variant H,N,VS,WARPS,STAGES ...]

Per point (batch x context x compress ratio x cache format x local heads): the default configuration
(`attn_config`), a set of variants (heads a program, rows a tile, value split, warps, stages; with and
without splitting the candidates over programs), and with --baseline another implementation of
`sparse_attention_sink` loaded from FILE (an earlier version of ops/sparse_attention.py), interleaved in
one run. Each is captured in a CUDA graph and its replay timed (graph_timer.graph_timing, L2 flushed
before each replay, median), and its output is compared with the torch twin's (relative error of the worst
row; a variant over 2e-2 is reported as wrong, not timed into the best).

`bytes` is what the kernel must read and write at the live counts (q, candidate rows as stored, indices,
output); `flop` counts the two products (4 * heads * candidates * D a token). Candidates compile in --jobs
processes first (Triton's on-disk cache then serves the timing process). Writes table.md and
timings.jsonl to OUT_DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

MAX_LEN = 36944  # the full-graph bench's runtime.max_len (32K contexts + decode room)
VARIANTS = (  # (block_h, block_n, value_split, num_warps, num_stages); block_h is clamped to the heads
    (64, 32, 1, 8, 2), (64, 64, 1, 8, 2), (64, 64, 1, 16, 2), (64, 32, 2, 4, 3), (64, 64, 2, 8, 2),
    (64, 64, 2, 8, 3), (32, 64, 1, 8, 2), (32, 32, 2, 4, 3), (16, 64, 1, 4, 2), (16, 32, 1, 4, 3),
    (16, 64, 2, 4, 3),
)


def points(quick: bool, cache: str | None = None, batches: list[int] | None = None, heads: int = 64
           ) -> list[tuple[int, int, int, bool, int]]:
    """(batch, context, ratio, fp8 rows, local heads): every point, or those of one cache format; with batches,
    `heads` heads at those batches (any) and the other points of those batches."""
    main = batches or ((1, 128) if quick else (1, 8, 32, 128, 256))
    out = [(b, 4096, r, f, heads) for f in (False, True) for r in (4, 128) for b in main]
    out += [(128, 4096, 4, f, h) for f in (False, True) for h in (8, 16, 32)]
    out += [(1, 4096, 4, False, 8), (128, 32768, 4, False, 64), (128, 32768, 4, True, 64)]
    return list(dict.fromkeys(p for p in out if (cache is None or p[3] == (cache == "fp8"))
                              and (not batches or p[0] in batches)))


def inputs(batch: int, ctx: int, ratio: int, fp8: bool, heads: int, dev: torch.device) -> tuple:
    """The attention arguments of one decode token per sequence at position ctx - 1 (seeded)."""
    from tp_runtime.config import ModelConfig
    from tp_runtime.model.rope import RotaryTable
    from tp_runtime.model.step_index import ring_index
    from tp_runtime.ops.cache_fp8 import quantize_rows

    m = ModelConfig()
    D, W, dr = m.head_dim, m.sliding_window, m.qk_rope_head_dim
    g = torch.Generator(device=dev).manual_seed(batch * 7 + ratio)

    def rows(*shape):
        x = torch.randn(*shape, generator=g, device=dev).to(torch.bfloat16)
        return quantize_rows(x, dr) if fp8 else x

    slot = torch.arange(batch, device=dev)
    pos = torch.full((batch,), ctx - 1, device=dev)
    ring = ring_index(W, slot, pos, slot, pos, pos, batch)
    cis = RotaryTable(dr, m.compress_rope_theta, m.rope_scaling, MAX_LEN + 1, dev).at(pos)
    q = (torch.randn(batch, heads, D, generator=g, device=dev) * 3).to(torch.bfloat16)
    comp = rows(batch + 1, -(-MAX_LEN // ratio), D)
    n_done = (pos + 1) // ratio
    if ratio == 4:
        live = ctx // 4
        picks = torch.stack([torch.randperm(live, generator=g, device=dev)[:m.index_topk] for _ in range(batch)])
        n_comp = m.index_topk
    else:
        picks, n_comp = None, MAX_LEN // ratio
    sink = torch.randn(heads, generator=g, device=dev)
    return (q, rows(batch, D), rows(batch + 1, W, D), ring, comp, slot, picks, n_done, n_comp, sink, D ** -0.5, cis)


def variants(batch: int, heads: int, n_cand: int, n_sm: int, table: tuple = VARIANTS):
    """AttnConfigs to try: each VARIANT without a split and, where its programs leave SMs idle, split
    to fill the SMs about once and twice."""
    from tp_runtime.ops.sparse_attention import AttnConfig

    seen = set()
    for entry in table:
        if isinstance(entry, AttnConfig):  # the wgmma kernel: one configuration, never split
            yield entry
            continue
        bh, bn, vs, nw, ns = entry
        bh = max(16, min(bh, 1 << (heads - 1).bit_length()))
        base = batch * -(-heads // bh) * vs
        lens = [-(-n_cand // bn) * bn]
        for fill in (1, 2):
            if base < n_sm * fill:
                splits = min(-(-n_cand // bn), -(-n_sm * fill // base))
                lens.append(-(-(-(-n_cand // splits)) // bn) * bn)
        for sl in lens:
            c = AttnConfig(bh, bn, nw, ns, sl, vs)
            if c not in seen:
                seen.add(c)
                yield c


def _compile(job: tuple) -> int:
    """Run one configuration at one point once (it compiles into Triton's cache); 1 if it ran."""
    point, cfg = job
    from tp_runtime.ops.sparse_attention import sparse_attention_sink

    dev = torch.device("cuda")
    args = inputs(*point, dev)
    out = torch.empty(point[0], point[4] * args[0].shape[-1], dtype=torch.bfloat16, device=dev)
    try:
        sparse_attention_sink(*args, out, config=cfg)
        torch.cuda.synchronize()
        return 1
    except Exception:  # reported by the timing pass
        return 0


def compile_jobs(pts: list, n_sm: int, table: tuple = VARIANTS) -> list[tuple]:
    """One (point, config) per distinct compiled kernel: the configuration with or without a split, the
    ratio, the cache format, and whether the head count divides by 16 (Triton specializes on it)."""
    jobs = {}
    for p in pts:
        for c in variants(p[0], p[4], 128 + (512 if p[2] == 4 else MAX_LEN // p[2]), n_sm, table):
            split = c.split_len < 128 + (512 if p[2] == 4 else MAX_LEN // p[2])
            # two tokens compile the same kernel as a batch does (no argument depends on the batch)
            jobs.setdefault((c._replace(split_len=0), split, p[2], p[3], p[4] % 16 == 0), ((2,) + p[1:], c))
    return sorted(jobs.values(), key=lambda j: j[0][0])  # small batches first: quick inputs


def load_baseline(path: Path):
    spec = importlib.util.spec_from_file_location("baseline_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sparse_attention_sink


def read_bandwidth(dev: torch.device) -> float:
    """Bytes/s of a plain read (sum) over 2 GiB."""
    from tp_runtime.graph_timer import graph_timing

    x = torch.randn(2 ** 29, device=dev)
    return x.numel() * 4 / (graph_timing(lambda: x.sum(), dev, budget_ms=(5, 50)).median_ms / 1e3)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--baseline", type=Path, help="a file defining sparse_attention_sink, timed beside")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="batch 1 and 128 only at 64 heads")
    ap.add_argument("--cache", choices=("bf16", "fp8"), help="points of one cache format only")
    ap.add_argument("--batches", type=int, nargs="+", help="points of these batches only")
    ap.add_argument("--heads", type=int, default=64, help="local heads of the points at every batch (a tp shard's)")
    ap.add_argument("--variant", action="append",
                    help="H,N,VS,WARPS,STAGES, wgmma,N,STAGES or wgmma_ws (repeat): replaces VARIANTS")
    return ap.parse_args(argv)


def parse_variant(text: str):
    """'H,N,VS,WARPS,STAGES' -> a VARIANTS entry; 'wgmma,N,STAGES' -> the Gluon kernel's AttnConfig; 'wgmma_ws'
    -> the warp-specialized Gluon kernel's (FP8 rows)."""
    from tp_runtime.ops.sparse_attention import WGMMA, WGMMA_WS

    head, *rest = text.split(",")
    if head == "wgmma_ws":
        return WGMMA_WS
    if head == "wgmma":
        return WGMMA._replace(block_n=int(rest[0]), num_stages=int(rest[1]))
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> None:
    from tp_runtime.bench.record_file import version_of, write_records
    from tp_runtime.graph_timer import graph_timing
    from tp_runtime.ops.cache_fp8 import row_bytes
    from tp_runtime.ops.sparse_attention import attn_config, sparse_attention_sink
    from tp_runtime.ops.sparse_attention_wgmma import wgmma_attention_fits
    from tp_runtime.ops.torch_path import sparse_attention_sink as attention_torch

    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    pts = points(a.quick, a.cache, a.batches, a.heads)
    table = tuple(parse_variant(v) for v in a.variant) if a.variant else VARIANTS
    t0 = time.time()
    jobs = compile_jobs(pts, n_sm, table)
    with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        ran = sum(pool.map(_compile, jobs))
    print(f"compiled {ran} of {len(jobs)} kernels in {time.time() - t0:.0f} s", flush=True)
    base = load_baseline(a.baseline) if a.baseline else None
    bw = read_bandwidth(dev)
    records, lines = [], []
    for p in pts:
        batch, ctx, ratio, fp8, heads = p
        args = inputs(*p, dev)
        D, n_comp = args[0].shape[-1], args[8]
        live = min(ctx // ratio, 512) if ratio == 4 else ctx // ratio
        row_b = row_bytes(D, 64) if fp8 else 2 * D
        nbytes = batch * (heads * D * 4 + (128 + live) * (row_b + 8))
        flop = 4 * batch * heads * (128 + live) * D
        ref = torch.empty(batch, heads * D, dtype=torch.bfloat16, device=dev)
        attention_torch(*args, ref)
        out = torch.empty_like(ref)

        def timed(fn, name, cfg=None):
            try:
                out.fill_(float("nan"))
                fn()
                err = rel_err(out, ref)
                ms = graph_timing(fn, dev, budget_ms=(5, 40), flush_l2=True).median_ms
            except Exception as e:  # a configuration that does not fit (registers, shared memory)
                print(f"  {p} {name} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                err, ms = None, None
            return dict(point=p, variant=name, config=cfg._asdict() if cfg else None, ms=ms, rel_err=err)

        fits = wgmma_attention_fits(dev, heads, D, 64, args[0].dtype)
        default = attn_config(batch, heads, 128 + n_comp, D, n_sm, fp8, wgmma=fits)
        rows = [timed(lambda: sparse_attention_sink(*args, out), "default", default)]
        if base is not None:
            rows.append(timed(lambda: base(*args, out), "baseline"))
        for c in variants(batch, heads, 128 + n_comp, n_sm, table):
            rows.append(timed(lambda c=c: sparse_attention_sink(*args, out, config=c), "variant", c))
        for r in rows:
            r.update(bytes=nbytes, flop=flop)
        ok = [r for r in rows if r["ms"] and r["rel_err"] is not None and r["rel_err"] < 2e-2]
        best = min((r for r in ok if r["variant"] == "variant"), key=lambda r: r["ms"], default=None)
        d, b = rows[0], next((r for r in rows if r["variant"] == "baseline"), None)
        fmt = "fp8" if fp8 else "bf16"
        us = (lambda r: f"{r['ms'] * 1e3:.1f}" if r and r["ms"] else "-")
        bc = best["config"] if best else {}
        line = (f"| {batch} | {ctx // 1024}K | {ratio} | {fmt} | {heads} | {us(b)} | {us(d)} | {us(best)} | "
                f"{tuple(bc.values())} | {100 * nbytes / (best['ms'] / 1e3) / bw if best else 0:.0f} | "
                f"{flop / (best['ms'] / 1e3) / 1e12 if best else 0:.0f} | "
                f"{max((r['rel_err'] or 0) for r in ok):.1e} |")
        print(line, flush=True)
        lines.append(line)
        records.append(dict(point=dict(batch=batch, context=ctx, ratio=ratio, cache=fmt, heads=heads), rows=rows))
    env = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=torch.version.cuda,
               triton=version_of("triton"), read_GBps=bw / 1e9, max_len=MAX_LEN)
    write_records(a.out / "timings.jsonl", [dict(env=env, **r) for r in records], settings=vars(a))
    head = [f"read bandwidth {bw / 1e9:.0f} GB/s; max_len {MAX_LEN}; bf16 q; Flash dims; us per layer", "",
            "| batch | ctx | ratio | cache | heads | baseline us | default us | best us | best config (h, n, warps, "
            "stages, split_len, value_split) | best bw % | best TFLOP/s | max rel err |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    (a.out / "table.md").write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
