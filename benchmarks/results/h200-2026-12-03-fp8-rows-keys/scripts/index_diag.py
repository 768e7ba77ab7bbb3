"""Diagnostic: the indexer's score kernel and score + top-K with FP8 keys packed (132-byte rows, before) against
codes and scales apart (now), bf16 keys beside; interleaved rounds, graph replays with the L2 flushed, us."""
import sys, statistics
import torch
sys.path.insert(0, ".")
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops import indexer_topk as new
from bench_tmp import old_indexer_topk as old
from bench_tmp.old_cache_fp8 import quantize_keys as old_quantize
from tp_runtime.ops.cache_fp8 import quantize_keys
from tp_runtime.config import ModelConfig

M = ModelConfig()
IH, ID, K = M.index_n_heads, M.index_head_dim, M.index_topk
N_KEYS = 36944 // 4
dev = torch.device("cuda")
n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
for batch, ctx in [(1, 32768), (32, 32768), (128, 32768), (128, 4096)]:
    for q_fp8 in (False, True):
        g = torch.Generator(device=dev).manual_seed(batch * 7 + ctx)
        keys = torch.randn(batch + 1, N_KEYS, ID, generator=g, device=dev).to(torch.bfloat16)
        q = torch.randn(batch, IH, ID, generator=g, device=dev).to(torch.bfloat16)
        w = torch.randn(batch, IH, generator=g, device=dev).to(torch.bfloat16)
        slot = torch.arange(batch, device=dev)
        nv = torch.full((batch,), ctx // 4, dtype=torch.long, device=dev)
        packed = old_quantize(keys)
        codes, scales = quantize_keys(keys)
        cfg = new.topk_config(batch, N_KEYS, n_sm)
        ocfg = old.topk_config(batch, N_KEYS, n_sm)
        fns = {
            "old fp8 topk": lambda: old.indexer_topk(q, w, packed, slot, nv, N_KEYS, K, config=ocfg, q_fp8=q_fp8),
            "new fp8 topk": lambda: new.indexer_topk(q, w, codes, slot, nv, N_KEYS, K, config=cfg, q_fp8=q_fp8,
                                                     key_scales=scales),
            "bf16 topk": lambda: new.indexer_topk(q, w, keys, slot, nv, N_KEYS, K, config=cfg, q_fp8=q_fp8),
            "old fp8 score": lambda: old.indexer_scores(q, w, packed, slot, nv, N_KEYS, q_fp8=q_fp8, config=ocfg),
            "new fp8 score": lambda: new.indexer_scores(q, w, codes, slot, nv, N_KEYS, q_fp8=q_fp8, config=cfg,
                                                        key_scales=scales),
            "bf16 score": lambda: new.indexer_scores(q, w, keys, slot, nv, N_KEYS, q_fp8=q_fp8, config=cfg),
        }
        a = fns["old fp8 topk"]().sort(1).values
        b = fns["new fp8 topk"]().sort(1).values
        same = bool(torch.equal(a, b))
        res = {k: [] for k in fns}
        for _ in range(3):
            for k, f in fns.items():
                res[k].append(graph_timing(f, dev, budget_ms=(5, 30), flush_l2=True).median_ms * 1e3)
        print(f"b{batch} ctx{ctx} q={'e4m3' if q_fp8 else 'bf16'} same_picks={same}: " +
              "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in res.items()), flush=True)
