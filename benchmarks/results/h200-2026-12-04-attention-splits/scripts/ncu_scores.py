"""Run the indexer score kernels (wgmma default, then Triton) at batch 128 / 32K, FP8 keys, for Nsight Compute."""
import sys
import torch
from benchmarks.indexer_sweep import N_KEYS, inputs, variant_config
dev = torch.device("cuda")
batch, ctx = 128, 32768
args, kw = inputs(batch, ctx, True, dev)
n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
from tp_runtime.ops.indexer_topk import indexer_scores
for name in ("default",):
    cfg = variant_config(name, batch, n_sm, True)
    print(name, cfg, flush=True)
    for _ in range(3):
        indexer_scores(*args, N_KEYS, config=cfg, **kw)
    torch.cuda.synchronize()
