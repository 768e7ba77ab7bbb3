"""Diagnostic: the wgmma attention kernel's FP8 path, old vs new vs new without the codes' decode (timing only)."""
import importlib.util, sys, statistics, json
import torch
sys.path.insert(0, ".")
from benchmarks.attention_sweep import inputs, rel_err
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops import sparse_attention as sa
from tp_runtime.ops.torch_path import sparse_attention_sink as ref_fn

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

mods = {"old": load("old_wgmma", "bench_tmp/old_wgmma.py").sparse_attention_wgmma,
        "new": sa.sparse_attention_wgmma,
        "nodecode": load("nodecode_wgmma", "bench_tmp/nodecode_wgmma.py").sparse_attention_wgmma}
dev = torch.device("cuda")
pts = [(128, 4096, 4, True, 64), (128, 4096, 128, True, 64), (256, 4096, 4, True, 64), (128, 4096, 4, True, 8),
       (128, 4096, 4, False, 64), (128, 4096, 128, False, 64)]
out_lines = []
for p in pts:
    args = inputs(*p, dev)
    ref = torch.empty(p[0], p[4] * 512, dtype=torch.bfloat16, device=dev)
    ref_fn(*args, ref)
    out = torch.empty_like(ref)
    res = {k: [] for k in mods}
    errs = {}
    for rnd in range(3):
        for k, f in mods.items():
            if not p[3] and k == "nodecode":
                continue
            sa.sparse_attention_wgmma = f
            fn = lambda: sa.sparse_attention_sink(*args, out, config=sa.WGMMA)
            out.fill_(float("nan")); fn(); torch.cuda.synchronize()
            errs[k] = rel_err(out, ref)
            res[k].append(graph_timing(fn, dev, budget_ms=(5, 40), flush_l2=True).median_ms * 1e3)
    line = f"{p}: " + "  ".join(f"{k} {statistics.median(v):.1f} us (err {errs[k]:.1e})" for k, v in res.items() if v)
    print(line, flush=True); out_lines.append(line)
sa.sparse_attention_wgmma = mods["new"]
