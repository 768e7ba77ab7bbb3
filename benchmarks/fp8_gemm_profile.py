"""One FP8 GEMM of the family (ops/fp8_gemm.py) run under a profiler: Nsight Compute's stall reasons and memory
throughput for the launch the tuning table picks, or one given, on weights streamed from HBM as in a step.

    ncu --clock-control none --kernel-name regex:'_wgmma_kernel|_fp8_gemm_kernel' --launch-skip 8 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \\
        -o out/ncu_wo_b python -m benchmarks.fp8_gemm_profile --n 4096 --k 8192 --m 128
    python -m benchmarks.fp8_gemm_profile --n 4096 --k 8192 --m 128 --config wgmma,64,64,2,4,4,1   (any launch)

Without a profiler it prints the launch and its time (CUDA events over the copies, the tuner's method).
--copies weight copies (each call reads another, so none is served from L2) are called in turn, --calls in all.
--config kernel,block_m,block_n,splits,num_warps,num_stages,in_flight (x rounded by one launch; "triton" with a
trailing ",q" rounds x in its prologue; "wgmma_ws" with a trailing ",k2" or ",k4" issues 2 or 4 K steps' MMAs a
wait).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from benchmarks.fp8_gemm_tune import L2_BYTES
from tp_runtime.ops.fp8_gemm import Fp8GemmConfig, fp8_gemm
from tp_runtime.ops.fp8_gemm_table import Fp8GemmTable
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.weights.fp8 import quantize_fp8


def parse_config(text: str) -> Fp8GemmConfig:
    """'kernel,block_m,block_n,splits,num_warps,num_stages,in_flight[,q][,kN]' -> the launch."""
    f = text.split(",")
    extra = f[7:]
    if len(f) < 7 or any(e != "q" and not (e[:1] == "k" and e[1:].isdigit()) for e in extra):
        raise argparse.ArgumentTypeError(f"--config {text!r}: kernel,block_m,block_n,splits,warps,stages,in_flight"
                                         "[,q][,kN]")
    kernel, *ints = f[:7]
    bm, bn, splits, warps, stages, in_flight = (int(v) for v in ints)
    kpw = next((int(e[1:]) for e in extra if e[:1] == "k"), 1)
    return Fp8GemmConfig(kernel, bm, bn, splits, warps, stages, "q" in extra, in_flight=in_flight, k_per_wait=kpw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="weight rows (all groups')")
    ap.add_argument("--k", type=int, default=8192, help="weight columns (one group's)")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--m", type=int, default=128, help="rows of x")
    ap.add_argument("--config", type=parse_config, help="a launch instead of the table's")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--copies", type=int, help="weight copies called in turn (default: enough to exceed the L2 4x)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    dev = torch.device("cuda")
    w = torch.randn(a.n, a.k, device=dev) * torch.logspace(-2, 1, a.n, device=dev)[:, None] / a.k ** 0.5
    copies = a.copies or max(2, math.ceil(4 * L2_BYTES / (a.n * a.k)))
    q, s = quantize_fp8(w)  # quantized once; the copies are clones (another address each, the same values)
    weights = [(q.clone(), s.clone()) for _ in range(copies)]
    x = torch.randn(a.m, a.groups * a.k, device=dev).to(torch.bfloat16)
    c = a.config or Fp8GemmTable.load().config(a.m, a.n, a.k, a.groups, x, sm_count(dev))
    for q, s in weights:  # compile, and make the split-K counters
        fp8_gemm(x, q, s, a.groups, c)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(a.calls):
        q, s = weights[i % copies]
        fp8_gemm(x, q, s, a.groups, c)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / a.calls
    print(f"N={a.n} K={a.k} groups={a.groups} M={a.m}: {c}; {us:.1f} us a call over {a.calls} calls "
          f"(the quantize launch and host launch gaps included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
