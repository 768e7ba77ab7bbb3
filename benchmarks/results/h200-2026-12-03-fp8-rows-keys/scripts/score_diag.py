"""Diagnostic: the score kernel with keys as the MMA's A operand (registers: the decode feeds the MMA, the head sum
stays in a warp) against the current one (keys as B, through shared memory); FP8 and bf16 keys, us."""
import sys, statistics, importlib.util
import torch
sys.path.insert(0, ".")
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops import indexer_topk as cur
from tp_runtime.ops.cache_fp8 import quantize_keys
from tp_runtime.config import ModelConfig
spec = importlib.util.spec_from_file_location("idx_t", "bench_tmp/indexer_topk_t.py")
tr = importlib.util.module_from_spec(spec); spec.loader.exec_module(tr)
M = ModelConfig()
IH, ID, K = M.index_n_heads, M.index_head_dim, M.index_topk
N_KEYS = 36944 // 4
dev = torch.device("cuda")
n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
for batch, ctx in [(128, 32768), (32, 32768), (1, 32768), (128, 4096)]:
    g = torch.Generator(device=dev).manual_seed(batch * 7 + ctx)
    keys = torch.randn(batch + 1, N_KEYS, ID, generator=g, device=dev).to(torch.bfloat16)
    q = torch.randn(batch, IH, ID, generator=g, device=dev).to(torch.bfloat16)
    w = torch.randn(batch, IH, generator=g, device=dev).to(torch.bfloat16)
    slot = torch.arange(batch, device=dev)
    nv = torch.full((batch,), ctx // 4, dtype=torch.long, device=dev)
    codes, scales = quantize_keys(keys)
    for fmt in ("fp8", "bf16"):
        kk, kw = (codes, dict(key_scales=scales)) if fmt == "fp8" else (keys, {})
        res = {}
        fns = {}
        for name, mod in (("cur", cur), ("keysA", tr)):
            cfg = mod.topk_config(batch, N_KEYS, n_sm)
            fns[name + " score"] = (lambda mod=mod, cfg=cfg: mod.indexer_scores(q, w, kk, slot, nv, N_KEYS, config=cfg, **kw))
            fns[name + " topk"] = (lambda mod=mod, cfg=cfg: mod.indexer_topk(q, w, kk, slot, nv, N_KEYS, K, config=cfg, **kw))
        a, b = fns["cur topk"]().sort(1).values, fns["keysA topk"]().sort(1).values
        sa, sb = fns["cur score"](), fns["keysA score"]()
        live = ctx // 4
        diff = float((sa[:, :live] - sb[:, :live]).abs().max() / sa[:, :live].abs().max())
        res = {k: [] for k in fns}
        for _ in range(3):
            for k, f in fns.items():
                res[k].append(graph_timing(f, dev, budget_ms=(5, 30), flush_l2=True).median_ms * 1e3)
        print(f"b{batch} ctx{ctx} keys={fmt} tokens_with_other_picks={int((a != b).any(1).sum())} score_rel_diff={diff:.1e}: " +
              "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in res.items()), flush=True)
