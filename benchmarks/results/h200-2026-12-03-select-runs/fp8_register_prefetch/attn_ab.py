"""The wgmma attention kernel alone: main's file (old) against the tree's (new, 64- and 32-row tiles)."""
import importlib.util, sys, statistics
import torch
sys.path.insert(0, ".")
from benchmarks.attention_sweep import inputs, rel_err
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops import sparse_attention as sa
from tp_runtime.ops.torch_path import sparse_attention_sink as ref_fn

spec = importlib.util.spec_from_file_location("old_wgmma", "bench_tmp/old_wgmma.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
new = sa.sparse_attention_wgmma
variants = {"old": (old.sparse_attention_wgmma, sa.WGMMA), "new": (new, sa.WGMMA),
            "new32": (new, sa.WGMMA._replace(block_n=32))}
dev = torch.device("cuda")
pts = [(128, 4096, 4, True, 64), (128, 4096, 128, True, 64), (256, 4096, 4, True, 64), (128, 4096, 4, True, 8),
       (128, 32768, 4, True, 64), (128, 4096, 4, False, 64), (128, 4096, 128, False, 64)]
for p in pts:
    args = inputs(*p, dev)
    ref = torch.empty(p[0], p[4] * 512, dtype=torch.bfloat16, device=dev)
    ref_fn(*args, ref)
    out = torch.empty_like(ref)
    res = {k: [] for k in variants}
    errs = {}
    for rnd in range(3):
        for k, (f, cfg) in variants.items():
            sa.sparse_attention_wgmma = f
            fn = lambda: sa.sparse_attention_sink(*args, out, config=cfg)
            out.fill_(float("nan")); fn(); torch.cuda.synchronize()
            errs[k] = rel_err(out, ref)
            res[k].append(graph_timing(fn, dev, budget_ms=(5, 40), flush_l2=True).median_ms * 1e3)
    print(f"{p}: " + "  ".join(f"{k} {statistics.median(v):.1f} us (err {errs[k]:.1e})" for k, v in res.items()),
          flush=True)
sa.sparse_attention_wgmma = new
