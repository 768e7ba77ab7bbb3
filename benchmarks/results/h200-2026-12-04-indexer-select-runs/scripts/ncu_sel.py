"""Run the indexer's top-K (score kernel + split select, default config) at one batch / 32K, FP8 keys, for Nsight
Compute: python bench_tmp/c1/ncu_sel.py BATCH."""
import sys
import torch
from benchmarks.indexer_sweep import K, N_KEYS, inputs, variant_config
from tp_runtime.ops.indexer_topk import indexer_topk
dev = torch.device("cuda")
batch, ctx = int(sys.argv[1]), 32768
args, kw = inputs(batch, ctx, True, dev)
n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
cfg = variant_config("default", batch, n_sm, True)
print(cfg, flush=True)
for _ in range(3):
    indexer_topk(*args, N_KEYS, K, config=cfg, **kw)
torch.cuda.synchronize()
