"""Time the Triton kernels of stage B against the torch path at Flash dims (one decode token per sequence).

    python -m benchmarks.time_kernels OUT_DIR [--sweep] [--fp8-cache]

Per point (batch x context), per kernel family, three variants:
  torch/ctx     the torch path with its candidate sets sized from the context (the eager, dynamic path)
  torch/static  the torch path sized from runtime.max_len, as the full graph runs it (MAX_LEN below)
  triton        the Triton kernels, sized from max_len too; they stop at each token's live count
Each variant is captured in a CUDA graph once and its replay timed with graph_timer.graph_timing
(20 ms of warm-up, 100 ms of replays; median; L2 flushed between replays), so in-graph launch gaps count but
host launch cost does not.
`bytes` is what the kernel must read (q, candidate rows or indexer keys, indices) and write (its
output), at the context's live counts; `bw %` is bytes / time over a read bandwidth measured here.
--sweep also times a few launch configurations of the attention kernel. --fp8-cache stores the window, kv,
compressed rows and indexer keys in the FP8 layouts (592-byte rows; keys of 128 e4m3 codes and an fp32 scale in
a tensor of its own, 132 bytes; ops/cache_fp8.py), read
in place by the kernels and gathered then dequantized by the torch path; `bytes` counts the stored bytes.
Writes table.md and timings.jsonl (bench/record_file.py) to OUT_DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from tp_runtime.bench.record_file import version_of, write_records
from tp_runtime.config import ModelConfig
from tp_runtime.graph_timer import graph_timing, time_budget
from tp_runtime.ops.torch_path import sparse_attention_sink as sparse_attention_torch
from tp_runtime.model.rope import RotaryTable
from tp_runtime.model.step_index import ring_index
from tp_runtime.ops import torch_path
from tp_runtime.ops.cache_fp8 import key_bytes, quantize_keys, quantize_rows, row_bytes
from tp_runtime.ops.indexer_topk import indexer_topk
from tp_runtime.ops.sparse_attention import AttnConfig, attn_config, sparse_attention_sink

DEV = torch.device("cuda")
M = ModelConfig()
H, D, W, K = M.num_attention_heads, M.head_dim, M.sliding_window, M.index_topk
IH, ID = M.index_n_heads, M.index_head_dim
MAX_LEN = 36944  # the full-graph bench's runtime.max_len (32K contexts + decode room)
DT = torch.bfloat16
FP8 = "--fp8-cache" in sys.argv
ROW_B = row_bytes(D, M.qk_rope_head_dim) if FP8 else 2 * D  # bytes of a stored attention row
KEY_B = key_bytes(ID) if FP8 else 2 * ID


def stored(x: torch.Tensor) -> torch.Tensor:
    """Cache rows as the run stores them: bf16, or FP8 bytes with --fp8-cache."""
    return quantize_rows(x, M.qk_rope_head_dim) if FP8 else x


def stored_keys(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Indexer keys x [..., Id] as the run stores them: (x, None) in bf16, or with --fp8-cache (e4m3 codes
    [..., Id], fp32 scales [...])."""
    return quantize_keys(x) if FP8 else (x, None)


def graph_time(fn) -> float:
    """Median ms of one replay of fn captured in a CUDA graph."""
    return graph_timing(fn, DEV, budget_ms=(20, 100), flush_l2=True).median_ms


def read_bandwidth() -> float:
    """Bytes/s of a plain read (sum) over 2 GiB, median of a few runs."""
    x = torch.randn(2 ** 29, device=DEV)
    ms = time_budget(lambda: x.sum(), DEV, warmup_ms=5, rep_ms=50).median_ms
    return x.numel() * 4 / (ms / 1e3)


def decode_step(batch: int, ctx: int):
    """batch decode tokens at position ctx - 1, one per slot; caches of slots = batch + trash."""
    slots = batch
    slot = torch.arange(batch, device=DEV)
    pos = torch.full((batch,), ctx - 1, device=DEV)
    idx = torch.arange(batch, device=DEV)
    ring = ring_index(W, slot, pos, idx, pos, pos, slots)
    table = RotaryTable(M.qk_rope_head_dim, M.compress_rope_theta, M.rope_scaling, MAX_LEN + 1, DEV)
    g = torch.Generator(device=DEV).manual_seed(0)

    def randn(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, device=DEV) * s).to(DT)

    return dict(slot=slot, pos=pos, ring=ring, cis=table.at(pos), q=randn(batch, H, D, s=3.0),
                kv=stored(randn(batch, D)), window=stored(randn(slots + 1, W, D)),
                sink=torch.randn(H, generator=g, device=DEV), randn=randn, slots=slots)


def attention_point(batch: int, ctx: int, ratio: int, sweep: bool) -> list[dict]:
    s = decode_step(batch, ctx)
    comp = stored(s["randn"](s["slots"] + 1, -(-MAX_LEN // ratio), D))
    n_done = (s["pos"] + 1) // ratio
    live = ctx // ratio
    if ratio == 4:
        picks = torch.stack([torch.randperm(live, device=DEV)[:K] for _ in range(batch)])
        c_ctx = c_static = K
        n_live = min(K, live)
    else:
        picks = None
        c_ctx, c_static, n_live = live, MAX_LEN // ratio, live
    out = torch.empty(batch, H * D, dtype=DT, device=DEV)

    def args(c):
        return (s["q"], s["kv"], s["window"], s["ring"], comp, s["slot"], picks, n_done, c, s["sink"], D ** -0.5,
                s["cis"])

    nbytes = batch * (2 * H * D * 2 + (W + n_live) * ROW_B + (W + n_live) * 8)
    name = f"attention r={ratio}"
    rows = [dict(kernel=name, variant="torch/ctx", ms=graph_time(lambda: sparse_attention_torch(*args(c_ctx), out))),
            dict(kernel=name, variant="torch/static",
                 ms=graph_time(lambda: sparse_attention_torch(*args(c_static), out)))]
    cfg = attn_config(batch, H, W + c_static, D, torch.cuda.get_device_properties(DEV).multi_processor_count, FP8)
    rows.append(dict(kernel=name, variant="triton", config=cfg._asdict(),
                     ms=graph_time(lambda: sparse_attention_sink(*args(c_static), out, config=cfg))))
    if sweep:
        for bh, bn, nw, ns in ((16, 32, 4, 2), (16, 32, 8, 2), (16, 64, 8, 2), (32, 32, 8, 2), (32, 64, 8, 2),
                               (64, 16, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3)):
            for split_len in sorted({cfg.split_len, 64, 128, 320, W + c_static}):
                if split_len % bn:
                    continue
                c = AttnConfig(bh, bn, nw, ns, split_len)
                try:
                    ms = graph_time(lambda: sparse_attention_sink(*args(c_static), out, config=c))
                except Exception as e:  # a configuration that does not fit (registers, shared memory)
                    ms = None
                    print(f"  config {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                rows.append(dict(kernel=name, variant="triton sweep", config=c._asdict(), ms=ms))
    for r in rows:
        r.update(batch=batch, context=ctx, bytes=nbytes)
    return rows


def indexer_point(batch: int, ctx: int) -> list[dict]:
    s = decode_step(batch, ctx)
    keys, key_scales = stored_keys(s["randn"](s["slots"] + 1, -(-MAX_LEN // 4), ID))
    q = s["randn"](batch, IH, ID)
    w = s["randn"](batch, IH)
    n_valid = (s["pos"] + 1) // 4
    live = ctx // 4
    nbytes = batch * (IH * ID * 2 + IH * 2 + live * KEY_B + K * 8)

    def run(fn, n_keys):
        return lambda: fn(q, w, keys, s["slot"], n_valid, n_keys, K, key_scales=key_scales)

    rows = [dict(kernel="indexer top-K", variant="torch/ctx", ms=graph_time(run(torch_path.indexer_topk, live))),
            dict(kernel="indexer top-K", variant="torch/static",
                 ms=graph_time(run(torch_path.indexer_topk, MAX_LEN // 4))),
            dict(kernel="indexer top-K", variant="triton", ms=graph_time(run(indexer_topk, MAX_LEN // 4)))]
    for r in rows:
        r.update(batch=batch, context=ctx, bytes=nbytes)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder of table.md and timings.jsonl")
    ap.add_argument("--sweep", action="store_true", help="also time launch configurations of the attention kernel")
    ap.add_argument("--fp8-cache", action="store_true", help="FP8 cache rows and keys (read at import: FP8)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    out, sweep = a.out, a.sweep
    out.mkdir(parents=True, exist_ok=True)
    bw = read_bandwidth()
    rows = []
    for batch in (1, 32, 128):
        for ctx in (4096, 32768):
            for ratio in (4, 128):
                rows += attention_point(batch, ctx, ratio, sweep and ctx == 4096)
            rows += indexer_point(batch, ctx)
            print(f"batch {batch} ctx {ctx} done", flush=True)
    for r in rows:
        if r["ms"]:
            r["bw_share"] = r["bytes"] / (r["ms"] / 1e3) / bw
    env = dict(device=torch.cuda.get_device_name(DEV), torch=torch.__version__, cuda=torch.version.cuda,
               triton=version_of("triton"), read_GBps=bw / 1e9, max_len=MAX_LEN, dtype=str(DT),
               cache_format="fp8" if FP8 else "bf16")
    write_records(out / "timings.jsonl", [dict(env=env, rows=rows)], settings=vars(a))
    lines = [f"read bandwidth (sum over 2 GiB): {bw / 1e9:.0f} GB/s; max_len {MAX_LEN}; bf16, {env['cache_format']} "
             "caches; Flash dims, tp 1", "",
             "| kernel | batch | ctx | torch/ctx us | torch/static us | triton us | static / triton | "
             "bytes (MB) | triton bw % |", "|---|---|---|---|---|---|---|---|---|"]
    key = {}
    for r in rows:
        key.setdefault((r["kernel"], r["batch"], r["context"]), {})[r["variant"]] = r
    for (k, b, c), v in key.items():
        t, st, tr = v["torch/ctx"], v["torch/static"], v["triton"]
        lines.append(f"| {k} | {b} | {c // 1024}K | {t['ms'] * 1e3:.1f} | {st['ms'] * 1e3:.1f} | "
                     f"{tr['ms'] * 1e3:.1f} | "
                     f"{st['ms'] / tr['ms']:.1f}x | {tr['bytes'] / 1e6:.2f} | {100 * tr['bw_share']:.0f} |")
    sw = [r for r in rows if r["variant"] == "triton sweep"]
    if sw:
        lines += ["", "| kernel | batch | ctx | block_h | block_n | warps | stages | split_len | us |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sw:
            c = r["config"]
            ms = f"{r['ms'] * 1e3:.1f}" if r["ms"] else "failed"
            lines.append(f"| {r['kernel']} | {r['batch']} | {r['context'] // 1024}K | {c['block_h']} | "
                         f"{c['block_n']} | "
                         f"{c['num_warps']} | {c['num_stages']} | {c['split_len']} | {ms} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
