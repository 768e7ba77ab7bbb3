"""Run the WS attention kernel (main's tree) at one point: a warm-up launch, then the profiled one."""
import sys
import torch
import tp_runtime.ops.sparse_attention as sa
from benchmarks.attention_sweep import inputs

b, ctx, r, h = (int(x) for x in sys.argv[1].split("/"))
dev = torch.device("cuda")
args = inputs(b, ctx, r, True, h, dev)
out = torch.empty(b, h * 512, dtype=torch.bfloat16, device=dev)
for _ in range(3):
    sa.sparse_attention_sink(*args, out, config=sa.WGMMA_WS)
torch.cuda.synchronize()
print("done")
