"""FP8 GEMM diagnostics: python bench_tmp/diag.py time|ncu|ws8 [OUT]
time: graph-timed launches (tuner's method) for a list; ncu: one call of each inside an NVTX range 'prof';
ws8: the warp-specialized candidates with 8 warps (and the 4-warp table winners) at the big shapes."""
import itertools, math, sys
import torch
sys.path.insert(0, ".")
from benchmarks.fp8_gemm_tune import L2_BYTES, graph_ms, wgmma_ws_candidates
from benchmarks.fp8_gemm_profile import parse_config
from tp_runtime.ops.fp8_gemm import fp8_gemm, fp8_gemm_torch
from tp_runtime.ops.fp8_gemm_table import Fp8GemmTable
from tp_runtime.weights.fp8 import quantize_fp8

dev = torch.device("cuda")
SHAPES = {"wq_b": (32768, 1024, 1), "wo_b": (4096, 8192, 1), "wo_a": (8192, 4096, 8), "wx": (1536, 4096, 1),
          "iwq_b": (8192, 1024, 1)}
table = Fp8GemmTable.load()
_w = {}


def weights(name):
    if name not in _w:
        n, k, g = SHAPES[name]
        w = torch.randn(n, k, device=dev) * torch.logspace(-2, 1, n, device=dev)[:, None] / k ** 0.5
        q, s = quantize_fp8(w)
        copies = max(2, math.ceil(4 * L2_BYTES / (n * k)))
        _w[name] = [(q.clone(), s.clone()) for _ in range(copies)]
    return _w[name]


def err(y, r):
    return float((y.float() - r.float()).norm() / r.float().norm())


def run(name, m, c, mode):
    n, k, g = SHAPES[name]
    qs = weights(name)
    x = torch.randn(m, g * k, device=dev).bfloat16()
    c = c or table.config(m, n, k, g, x, 132)
    try:
        e = err(fp8_gemm(x, qs[0][0], qs[0][1], g, c), fp8_gemm_torch(x, qs[0][0], qs[0][1], g))
        if mode == "ncu":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("prof")
            fp8_gemm(x, qs[1][0], qs[1][1], g, c)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"{name} M={m} {tuple(c)} err {e:.1e}", flush=True)
            return
        us = 1e3 * graph_ms(lambda i: fp8_gemm(x, qs[i][0], qs[i][1], g, c), len(qs))
        gb = n * k / us / 1e3
        print(f"{name} M={m} {tuple(c)} {us:.1f} us {gb:.2f} TB/s err {e:.1e}", flush=True)
    except Exception as ex:  # noqa: BLE001
        print(f"{name} M={m} {tuple(c)} FAILED {str(ex)[:300]}", flush=True)


def main():
    mode = sys.argv[1]
    if mode in ("time", "ncu"):
        pts = [("wq_b", 128, None), ("wq_b", 128, "scaled_mm,16,128,1,4,4,1"), ("wo_b", 128, None),
               ("wo_b", 128, "scaled_mm,16,128,1,4,4,1"), ("wo_a", 128, None), ("wq_b", 8, None),
               ("wo_b", 256, None), ("wq_b", 256, "wgmma_ws,128,64,1,4,4,1"), ("wx", 128, None)]
        for name, m, cfg in pts:
            run(name, m, parse_config(cfg) if cfg else None, mode)
    elif mode == "ws8":
        for name, m in itertools.product(("wq_b", "wo_b", "wo_a"), (64, 128, 256)):
            n, k, g = SHAPES[name]
            run(name, m, None, "time")
            cands = [c for c in wgmma_ws_candidates(m, n, k, g, 132) if c.num_warps == 8]
            seen = set()
            for c in cands:
                key = (c.block_m, c.block_n, c.num_stages)
                if key in seen:  # the first split count only
                    continue
                seen.add(key)
                run(name, m, c, "time")


if __name__ == "__main__":
    main()
