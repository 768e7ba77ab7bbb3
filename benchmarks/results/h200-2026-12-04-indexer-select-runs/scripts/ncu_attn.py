"""Run the decode attention at one point with its default configuration (a warm-up, then profiled launches)."""
import sys
import torch
import tp_runtime.ops.sparse_attention as sa
from benchmarks.attention_sweep import inputs

b, ctx, r, h, fp8 = (int(x) for x in sys.argv[1].split("/"))
dev = torch.device("cuda")
args = inputs(b, ctx, r, bool(fp8), h, dev)
out = torch.empty(b, h * 512, dtype=torch.bfloat16, device=dev)
for _ in range(4):
    sa.sparse_attention_sink(*args, out)
torch.cuda.synchronize()
print("done")
