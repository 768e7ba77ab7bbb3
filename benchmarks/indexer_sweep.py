"""Time the indexer's score + top-K select (ops/indexer_topk.py) per variant, Flash dims, one decode token a sequence.

    python -m benchmarks.indexer_sweep OUT_DIR [--rounds 3] [--batches 1 32 128] [--contexts 4096 32768]
        [--indexer-q bf16 e4m3] [--baseline FILE] [--variants default s3 ...]

Per point (batch x context x key format: bf16, FP8 from ops/cache_fp8.quantize_keys x query: bf16, or e4m3 as
runtime.indexer_q=e4m3 rounds it, which over FP8 keys is the FP8-dot score kernel), the variants of VARIANTS below
(topk_config's choice for the key format, "default"; the other selects; the score kernel's launches: stages, tiles,
run lengths), the default's score kernel alone (what the select adds is the rest) and, with --baseline, another
ops/indexer_topk.py at its own defaults (its whole top-K and its score kernel: `git show
REV:tp_runtime/ops/indexer_topk.py > FILE`, and its topk_select.py and indexer_scores_wgmma.py beside it; over
FP8 keys it must take them as codes and key_scales, the layout since FP8 keys were split in two tensors). Sized
from MAX_LEN (n_keys = MAX_LEN / 4 as the full graph runs it); each token has context / 4 live keys. Each variant
is captured in a CUDA graph and its replays timed (tp_runtime.graph_timer, L2 flushed before each replay); the
variants are timed in turn, `rounds` times (interleaved, so drift hits all alike), and the median of the round
medians is kept. Each variant's picks must equal the default's as sets (`same` in the table; the run fails
otherwise). Writes table.md and timings.jsonl (bench/record_file.py) to OUT_DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from tp_runtime.bench.record_file import version_of, write_records
from tp_runtime.config import ModelConfig
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops.cache_fp8 import quantize_keys
from tp_runtime.ops.indexer_topk import TopkConfig, indexer_scores, indexer_topk, topk_config, wgmma_scores

M = ModelConfig()
IH, ID, K = M.index_n_heads, M.index_head_dim, M.index_topk
MAX_LEN = 36944  # the full-graph bench's runtime.max_len (32K contexts + decode room), as benchmarks/time_kernels
N_KEYS = MAX_LEN // 4
DT = torch.bfloat16
# name -> changes to topk_config's choice
VARIANTS = {
    "default": dict(),  # topk_config's choice (the split select, runs of 512 or 2048); the others are checked
    # against it
    "fused": dict(select="fused", chunk=1024),
    "radix": dict(select="radix", chunk=2048),  # the separate one-program-per-token select
    "regs w8": dict(select="regs", chunk=1024, select_warps=8),  # the scores in registers, 8-bit digits
    # the split select's runs of 512 / 1024 / 2048 scores (the default picks by batch: `_select_runs`)
    "split c512": dict(select="split", chunk=512, select_warps=8),
    "split c1024": dict(select="split", chunk=1024, select_warps=8),
    "split c2048": dict(select="split", chunk=2048, select_warps=8),
    # runs of 4096 / 8192 (one or two a token at 32K: no look-back waits where tokens fill the SMs), 16 warps and
    # the compiler's registers for 8192 (32 scores a thread at 8 warps)
    "split c4096": dict(select="split", chunk=4096, select_warps=8),
    "split c8192": dict(select="split", chunk=8192, select_warps=8),
    "split c8192 w16": dict(select="split", chunk=8192, select_warps=16, select_regs=0),
    # the split select's finish and registers: one sort of 512 slots (before sort sizes), at most 64 / 80 registers
    # a thread (4 / 3 programs of 8 warps an SM; the default 72: 3), the compiler's choice (116: 2 an SM)
    "sort 512": dict(sort_sizes=1),
    "regs 64": dict(select_regs=64),
    "regs 80": dict(select_regs=80),
    "regs 96": dict(select_regs=96),
    # the split select's first digit (fewer bins to scan, more keys in the threshold bin) and its warps
    "hi 11": dict(hi_bits=11),
    "hi 10": dict(hi_bits=10),
    "select w4": dict(select_warps=4),
    "select w4 regs any": dict(select_warps=4, select_regs=0),
    "regs any": dict(select_regs=0),
    # the score kernel's launch (the default's select): blocks in flight, key blocks of 128 on 8 warps, longer runs
    "s2": dict(stages=2),
    "s3": dict(stages=3),
    "s4": dict(stages=4),
    "s3 runs x2": dict(stages=3, run_scale=2),
    "runs x2": dict(run_scale=2),  # the default's ring, 2 / 4 / 8 times the blocks a program (fewer q loads)
    "runs x4": dict(run_scale=4),
    "runs x8": dict(run_scale=8),
    "n128 w8 s3": dict(block_n=128, num_warps=8, stages=3),
    "n128 w8 s4": dict(block_n=128, num_warps=8, stages=4),
    # FP8 keys and a 16-bit q on Hopper: the Triton score kernel (3 stages) where the default is the wgmma one
    "triton scores": dict(score_kernel="triton", stages=3),
    "score regs 96": dict(score_regs=96),  # 5 programs an SM where its ~120 registers leave 4
}


def variant_config(name: str, batch: int, n_sm: int, fp8: bool = False, q_fp8: bool = False) -> TopkConfig:
    """topk_config's choice (for FP8 keys where fp8; the wgmma score kernel where it covers them) with
    VARIANTS[name] applied. A score program's run keeps the default's keys where block_n changes (blocks scaled
    inversely); run_scale multiplies its blocks."""
    wgmma = wgmma_scores(torch.device("cuda"), IH, ID, DT, fp8, q_fp8)
    cfg = topk_config(batch, N_KEYS, n_sm, fp8, wgmma)
    change = dict(VARIANTS[name])
    blocks = cfg.blocks * change.pop("run_scale", 1)
    if "block_n" in change:
        blocks = max(1, blocks * cfg.block_n // change["block_n"])
    return cfg._replace(blocks=blocks, **change)


def inputs(batch: int, ctx: int, fp8: bool, dev: torch.device) -> tuple[tuple, dict]:
    """The positional arguments (q [B, Ih, Id], w [B, Ih], keys [B + 1, N_KEYS, Id] (FP8: e4m3 codes), slot [B],
    n_valid [B] = ctx / 4) and the keyword ones ({} or, FP8, key_scales [B + 1, N_KEYS] fp32)."""
    g = torch.Generator(device=dev).manual_seed(batch * 7 + ctx)
    keys = torch.randn(batch + 1, N_KEYS, ID, generator=g, device=dev).to(DT)
    q = torch.randn(batch, IH, ID, generator=g, device=dev).to(DT)
    w = torch.randn(batch, IH, generator=g, device=dev).to(DT)
    slot = torch.arange(batch, device=dev)
    n_valid = torch.full((batch,), ctx // 4, dtype=torch.long, device=dev)
    if not fp8:
        return (q, w, keys, slot, n_valid), {}
    codes, scales = quantize_keys(keys)
    return (q, w, codes, slot, n_valid), dict(key_scales=scales)


BASELINE_SIBLINGS = ("topk_select", "indexer_scores_wgmma")  # modules indexer_topk.py imports from ops/


def load_baseline(path: Path):
    """The module of another ops/indexer_topk.py (`git show REV:tp_runtime/ops/indexer_topk.py > FILE`); a
    topk_select.py or indexer_scores_wgmma.py beside FILE (the same revision's) is the module it imports, else
    this tree's."""
    own = {}
    for sibling in BASELINE_SIBLINGS:
        name = f"tp_runtime.ops.{sibling}"
        if (path.parent / f"{sibling}.py").exists():
            own[name] = sys.modules[name]
            sys.modules[name] = _load(f"baseline_{sibling}", path.parent / f"{sibling}.py")
    try:
        return _load("baseline_indexer_topk", path)
    finally:
        sys.modules.update(own)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def point(batch: int, ctx: int, fp8: bool, rounds: int, dev: torch.device, n_sm: int,
          q_fp8: bool = False, base=None, variants: list[str] | None = None) -> list[dict]:
    variants = variants or list(VARIANTS)
    args, keys_kw = inputs(batch, ctx, fp8, dev)
    cfgs = {name: variant_config(name, batch, n_sm, fp8, q_fp8) for name in ["default"] + [v for v in variants
                                                                                  if v != "default"]}
    ref = indexer_topk(*args, N_KEYS, K, config=cfgs["default"], q_fp8=q_fp8, **keys_kw).sort(dim=1).values
    rows = {}
    for name, cfg in cfgs.items():  # compile and check outside the timing
        got = indexer_topk(*args, N_KEYS, K, config=cfg, q_fp8=q_fp8, **keys_kw).sort(dim=1).values
        rows[name] = dict(batch=batch, context=ctx, keys="fp8" if fp8 else "bf16", q="e4m3" if q_fp8 else "bf16",
                          variant=name, config=cfg._asdict(), same=bool(torch.equal(got, ref)), samples_ms=[])
    score = dict(rows["default"], variant="score kernel alone", samples_ms=[])  # the select's share: the rest
    for _ in range(rounds):
        for name, cfg in cfgs.items():
            t = graph_timing(lambda c=cfg: indexer_topk(*args, N_KEYS, K, config=c, q_fp8=q_fp8, **keys_kw), dev,
                             budget_ms=(5, 30), flush_l2=True)
            rows[name]["samples_ms"].append(t.median_ms)
        t = graph_timing(lambda: indexer_scores(*args, N_KEYS, q_fp8=q_fp8, config=cfgs["default"], **keys_kw), dev,
                         budget_ms=(5, 30), flush_l2=True)
        score["samples_ms"].append(t.median_ms)
        if base is not None:  # its own default configuration
            for name, fn in (("baseline", base.indexer_topk), ("baseline score kernel", base.indexer_scores)):
                kw = dict(q_fp8=q_fp8, **keys_kw) if fn is base.indexer_scores else dict(q_fp8=q_fp8, k=K, **keys_kw)
                t = graph_timing(lambda f=fn, kw=kw: f(*args, N_KEYS, **kw), dev, budget_ms=(5, 30), flush_l2=True)
                rows.setdefault(name, dict(score, variant=name, config=None, samples_ms=[]))["samples_ms"].append(
                    t.median_ms)
    rows[score["variant"]] = score
    for r in rows.values():
        r["us"] = 1e3 * statistics.median(r["samples_ms"])
    return list(rows.values())


def table(rows: list[dict], env: dict) -> str:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    lines = [f"{env['device']}; max_len {MAX_LEN} ({N_KEYS} keys a token, context / 4 live); Flash dims "
             f"(Ih {IH}, Id {ID}, K {K}); graph replays, L2 flushed; median of {env['rounds']} interleaved rounds", "",
             "| batch | ctx | keys | q | " + " | ".join(f"{n} us" for n in names) + " | best / default | same sets |",
             "|---|---|---|---|" + "---|" * (len(names) + 2)]
    by_point: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_point.setdefault((r["batch"], r["context"], r["keys"], r["q"]), {})[r["variant"]] = r
    for (b, c, kf, qf), v in by_point.items():
        differ = [n for n, x in v.items() if not x["same"]]
        same = "NO: " + ", ".join(differ) if differ else "yes"
        lines.append(f"| {b} | {c // 1024}K | {kf} | {qf} | " + " | ".join(f"{v[n]['us']:.1f}" for n in names) +
                     f" | {min(x['us'] for n, x in v.items() if 'score kernel' not in n) / v['default']['us']:.2f}x"
                     f" | {same} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder of table.md and timings.jsonl")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per point")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--baseline", type=Path, help="another ops/indexer_topk.py, timed beside (its defaults)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="VARIANTS timed (the default always, first)")
    ap.add_argument("--indexer-q", nargs="+", choices=["bf16", "e4m3"], default=["bf16"],
                    help="query formats (runtime.indexer_q); e4m3 over FP8 keys times the FP8-dot score kernel")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    dev = torch.device("cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    base = load_baseline(a.baseline) if a.baseline else None
    t0 = time.perf_counter()
    rows = []
    for batch in a.batches:
        for ctx in a.contexts:
            for fp8 in (False, True):
                for iq in a.indexer_q:
                    got = point(batch, ctx, fp8, a.rounds, dev, n_sm, q_fp8=iq == "e4m3", base=base,
                                variants=a.variants)
                    rows += got
                    print(f"batch {batch} ctx {ctx} keys {'fp8' if fp8 else 'bf16'} q {iq}: "
                          + ", ".join(f"{r['variant']} {r['us']:.1f} us" for r in got)
                          + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    env = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=torch.version.cuda,
               triton=version_of("triton"), max_len=MAX_LEN, dtype=str(DT), rounds=a.rounds, sms=n_sm)
    write_records(a.out / "timings.jsonl", [dict(env=env, rows=rows)], settings={**vars(a), "out": str(a.out)})
    text = table(rows, env)
    (a.out / "table.md").write_text(text)
    print(text)
    bad = [r for r in rows if not r["same"]]
    if bad:
        raise SystemExit(f"{len(bad)} variant(s) picked other sets than the default: "
                         + ", ".join(f"{r['variant']} b{r['batch']} {r['context']} {r['keys']} q {r['q']}"
                                     for r in bad))


if __name__ == "__main__":
    main()
