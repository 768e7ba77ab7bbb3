"""The indexer's top-K at few tokens, in parts: the score kernel with its bins (after the bins' memset), the
split select alone (the bins restored from a copy first; the copy timed alone too), the whole top-K (PDL off
and on), and the whole top-K of d17e574's indexer_topk.py (bf16 keys; the tree of the earlier 23.3 us at
batch 1 / 32K). Graph replays, L2 flushed, median of 2 interleaved rounds. python bench_tmp/s2/select_diag.py"""
import importlib.util
import statistics
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.indexer_sweep import K, N_KEYS, inputs, variant_config  # noqa: E402
from tp_runtime.graph_timer import graph_timing  # noqa: E402
from tp_runtime.ops import indexer_topk as itk  # noqa: E402

dev = torch.device("cuda")
spec = importlib.util.spec_from_file_location("old_itk", "bench_tmp/s2/old_indexer_topk.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def parts(batch, ctx, fp8):
    (q, w, keys, slot, nv), kw = inputs(batch, ctx, fp8, dev)
    ks = kw.get("key_scales")
    cfg = variant_config("default", batch, 132)
    hist = torch.zeros(batch, (1 << cfg.hi_bits) + 1, dtype=torch.int32, device=dev)
    scores = torch.empty(batch, N_KEYS, dtype=torch.float32, device=dev)
    out = torch.empty(batch, K, dtype=torch.long, device=dev)

    def score_bins():
        hist.zero_()
        itk._launch_scores(q, w, keys, ks, slot, nv, K, cfg, False, False, scores, hist, bins_from=cfg.chunk)

    score_bins()
    saved = hist.clone()
    fns = {"memset + score with bins": score_bins,
           "bins copy": lambda: hist.copy_(saved),
           "bins copy + split select": lambda: (hist.copy_(saved), itk._launch_split(scores, hist, nv, out, cfg, False)),
           "top-K": lambda: itk.indexer_topk(q, w, keys, slot, nv, N_KEYS, K, config=cfg, key_scales=ks),
           "top-K, PDL": lambda: itk.indexer_topk(q, w, keys, slot, nv, N_KEYS, K, config=cfg, key_scales=ks, pdl=True)}
    if not fp8:
        fns["d17e574 top-K"] = lambda: old.indexer_topk(q, w, keys, slot, nv, N_KEYS, K)
    ref = itk.indexer_topk(q, w, keys, slot, nv, N_KEYS, K, config=cfg, key_scales=ks).sort(dim=1).values
    fns["bins copy + split select"]()
    same = torch.equal(out.sort(dim=1).values, ref)
    if not fp8:
        same &= torch.equal(old.indexer_topk(q, w, keys, slot, nv, N_KEYS, K).sort(dim=1).values, ref)
    samples = {n: [] for n in fns}
    for _ in range(2):
        for n, f in fns.items():
            samples[n].append(1e3 * graph_timing(f, dev, budget_ms=(5, 30), flush_l2=True).median_ms)
    print(f"batch {batch} ctx {ctx} keys {'fp8' if fp8 else 'bf16'} same picks: {same}")
    for n, v in samples.items():
        print(f"    {n:28s} {statistics.median(v):7.1f} us   ({', '.join(f'{x:.1f}' for x in v)})")
    sys.stdout.flush()


for batch, ctx in [(1, 32768), (8, 32768)]:
    for fp8 in (False, True):
        parts(batch, ctx, fp8)
