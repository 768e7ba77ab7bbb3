"""The wgmma attention kernel alone at 8-32 heads: main's file (old: heads padded to 64 on M) against the tree's
(new: heads on N). Prints the largest head count up to which new wins at every point timed (0: none)."""
import importlib.util, sys, statistics
import torch
sys.path.insert(0, ".")
from benchmarks.attention_sweep import inputs, rel_err
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops import sparse_attention as sa
from tp_runtime.ops import sparse_attention_wgmma as mod
from tp_runtime.ops.torch_path import sparse_attention_sink as ref_fn

spec = importlib.util.spec_from_file_location("old_wgmma", "bench_tmp/old_wgmma.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
new = sa.sparse_attention_wgmma
mod.FEW_HEADS = 32
variants = {"old": old.sparse_attention_wgmma, "new": new}
dev = torch.device("cuda")
pts = [(128, 4096, 4, fp8, h) for h in (8, 16, 32) for fp8 in (True, False)]
pts += [(128, 4096, 128, True, 8), (128, 4096, 128, False, 8), (128, 32768, 4, True, 8)]
wins = {}
for p in pts:
    args = inputs(*p, dev)
    ref = torch.empty(p[0], p[4] * 512, dtype=torch.bfloat16, device=dev)
    ref_fn(*args, ref)
    out = torch.empty_like(ref)
    res, errs = {k: [] for k in variants}, {}
    for rnd in range(2):
        for k, f in variants.items():
            sa.sparse_attention_wgmma = f
            fn = lambda: sa.sparse_attention_sink(*args, out, config=sa.WGMMA)
            out.fill_(float("nan")); fn(); torch.cuda.synchronize()
            errs[k] = rel_err(out, ref)
            res[k].append(graph_timing(fn, dev, budget_ms=(5, 30), flush_l2=True).median_ms * 1e3)
    med = {k: statistics.median(v) for k, v in res.items()}
    ok = med["new"] < med["old"] and errs["new"] < 1e-2
    wins[p[4]] = wins.get(p[4], True) and ok
    print(f"{p}: " + "  ".join(f"{k} {med[k]:.1f} us (err {errs[k]:.1e})" for k in variants)
          + f"  new/old {med['new'] / med['old']:.3f}", flush=True)
sa.sparse_attention_wgmma = new
th = 0
for h in (8, 16, 32):
    if not wins[h]:
        break
    th = h
print("FEW_HEADS", th)
