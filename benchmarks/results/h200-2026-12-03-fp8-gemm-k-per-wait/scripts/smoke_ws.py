"""The warp-specialized FP8 GEMM against the torch twin, one tile kind per process (a fault names its tile):
python bench_tmp/smoke_ws.py BM BN WARPS STAGES KPW"""
import itertools, sys, time
import torch
from tp_runtime.ops.fp8_gemm import Fp8GemmConfig, fp8_gemm, fp8_gemm_torch
from tp_runtime.weights.fp8 import quantize_fp8

bm, bn, w, st, kpw = (int(a) for a in sys.argv[1:6])
dev = torch.device("cuda")
def err(y, r): return float((y.float() - r.float()).norm() / r.float().norm())
torch.manual_seed(0)
q, s = quantize_fp8(torch.randn(4096, 1024, device=dev) / 32)
for m, sp, pdl in itertools.product((5, 64, 300), (1, 3), (False, True)):
    x = torch.randn(m, 1024, device=dev).bfloat16()
    c = Fp8GemmConfig("wgmma_ws", bm, bn, sp, w, st, False, k_per_wait=kpw)
    t0 = time.time()
    y = fp8_gemm(x, q, s, 1, c, pdl=pdl); torch.cuda.synchronize()
    print(f"m={m} {bm}x{bn} w{w} st{st} kpw{kpw} s{sp} pdl{int(pdl)}: err {err(y, fp8_gemm_torch(x, q, s)):.2e} ({time.time() - t0:.1f} s)", flush=True)
