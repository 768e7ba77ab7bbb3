"""ncu targets: the score kernel at batch 128 / 32K (bf16 and FP8 keys, stages 2 and 3) and the whole top-K at
batch 1 / 4K and 32K (default), each once inside an NVTX range 'prof' (after a warm call outside it)."""
import sys
import torch
sys.path.insert(0, ".")
from benchmarks.indexer_sweep import N_KEYS, K, inputs, variant_config
from tp_runtime.ops.indexer_topk import indexer_scores, indexer_topk

dev = torch.device("cuda")


def prof(fn):
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


for fp8 in (False, True):
    args, kw = inputs(128, 32768, fp8, dev)
    for v in ("default", "s3", "n128 w8 s3"):
        cfg = variant_config(v, 128, 132)
        prof(lambda: indexer_scores(*args, N_KEYS, config=cfg, **kw))
        print("scores b128 32K", "fp8" if fp8 else "bf16", v, flush=True)
for ctx in (4096, 32768):
    args, kw = inputs(1, ctx, True, dev)
    cfg = variant_config("default", 1, 132)
    prof(lambda: indexer_topk(*args, N_KEYS, K, config=cfg, **kw))
    print("topk b1", ctx, flush=True)
