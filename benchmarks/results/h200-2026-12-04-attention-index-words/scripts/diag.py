"""Time WS attention kernel variants (diagnostics) and read a clock64 timeline of the kernel's phases."""
import importlib.util, statistics, sys, time
from pathlib import Path
import torch
import tp_runtime.ops.sparse_attention as sa
from benchmarks.attention_sweep import inputs, rel_err
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops.torch_path import sparse_attention_sink as twin

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
names = sys.argv[1].split(",")
pts = [tuple(int(x) for x in p.split("/")) for p in sys.argv[2].split(",")]  # batch/ctx/ratio/heads
mods = {}
for n in names:
    spec = importlib.util.spec_from_file_location(f"wsv_{n}", HERE / f"v_{n}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods[n] = m
dev = torch.device("cuda")
orig = sa.sparse_attention_ws
for (b, ctx, r, h) in pts:
    args = inputs(b, ctx, r, True, h, dev)
    ref = torch.empty(b, h * 512, dtype=torch.bfloat16, device=dev); twin(*args, ref)
    out = torch.empty_like(ref)
    res = {n: [] for n in names}
    errs = {}
    for n, m in mods.items():
        if hasattr(m, "DBG"):
            m.DBG = torch.zeros(b, 16, dtype=torch.int64, device=dev)
    for rnd in range(2):
        for n, m in mods.items():
            sa.sparse_attention_ws = m.sparse_attention_ws
            fn = lambda: sa.sparse_attention_sink(*args, out, config=sa.WGMMA_WS)
            try:
                t0 = time.time(); out.fill_(float("nan")); fn(); torch.cuda.synchronize()
                errs[n] = rel_err(out, ref)
                res[n].append(graph_timing(fn, dev, budget_ms=(5, 40), flush_l2=True).median_ms * 1e3)
            except Exception as e:
                print(f"{(b, ctx, r, h)} {n}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                res[n].append(float("nan"))
    sa.sparse_attention_ws = orig
    line = " ".join(f"{n}={statistics.median(v):.1f}us(err {errs.get(n, float('nan')):.1e})" for n, v in res.items())
    print(f"b{b} ctx{ctx} r{r} h{h}: {line}", flush=True)
    for n, m in mods.items():
        if not hasattr(m, "DBG"):
            continue
        sa.sparse_attention_ws = m.sparse_attention_ws
        for _ in range(3):
            torch.empty(256 << 20, dtype=torch.int8, device=dev).zero_()  # flush L2
            m.DBG.zero_(); sa.sparse_attention_sink(*args, out, config=sa.WGMMA_WS); torch.cuda.synchronize()
        sa.sparse_attention_ws = orig
        d = m.DBG.cpu()
        c = d[:, :12].double()
        ns = (d[:, 13] - d[:, 12]).double()
        ghz = ((c[:, 4] - c[:, 0]) / ns).median().item()
        def us(x):
            x = x.double() / ghz / 1e3
            return f"{x.median().item():6.2f} [{x.min().item():.2f}-{x.max().item():.2f}]"
        g0 = d[:, 12].min()
        print(f"  {n}: clock {ghz:.2f} GHz; CTA start spread {(d[:, 12].max() - g0).item() / 1e3:.2f} us, "
              f"last end {(d[:, 13].max() - g0).item() / 1e3:.2f} us; CTAs a SM max {torch.bincount(d[:, 14]).max().item()}")
        rows = [("q stored", c[:, 1] - c[:, 0]), ("first tile ready (from start)", c[:, 2] - c[:, 0]),
                ("loop: first ready -> last tile done", c[:, 3] - c[:, 2]), ("softmax epilogue", c[:, 4] - c[:, 3]),
                ("values end (from start)", c[:, 9] - c[:, 0]), ("softmax waits on ready (sum)", c[:, 10]),
                ("loader start (from start)", c[:, 5] - c[:, 0]), ("loader prologue", c[:, 6] - c[:, 5]),
                ("loader first arrive (from its start)", c[:, 7] - c[:, 5]), ("loader end (from its start)", c[:, 8] - c[:, 5]),
                ("whole CTA (softmax end)", c[:, 4] - c[:, 0])]
        for name, x in rows:
            if (x != 0).any():
                print(f"    {name:40s} {us(x)} us")
