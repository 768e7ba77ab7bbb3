"""The ranks of tests/test_allreduce_gpu.py, started by torchrun (one per GPU): the symmetric-memory paths
(symm_one_shot, symm_two_shot, auto) against NCCL on random data at many sizes in bf16 and fp32, eagerly
and as back-to-back calls inside one CUDA graph; rank 0 writes what it found as JSON.

    torchrun --standalone --nproc-per-node 2 tests/allreduce_gpu_ranks.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tp_runtime.parallel.allreduce import setup_allreduce
from tp_runtime.parallel.group import init_from_env, shutdown

# Elements per message: tiny, unaligned (NCCL's), the layer sizes [T, 4096] for T = 1 .. 512, and past the
# 4 MB buffer in bf16 (NCCL's).
SIZES = [8, 12, 1000, 1001, 4096, 8 * 4096, 32 * 4096, 128 * 4096, 512 * 4096, 640 * 4096]
PATHS = ("symm_one_shot", "symm_two_shot", "auto")


def _compare(tp, got: torch.Tensor, ref: torch.Tensor) -> dict:
    """How got differs from NCCL's ref, and whether every rank holds the same got."""
    gathered = [torch.empty_like(got) for _ in range(tp.size)]
    dist.all_gather(gathered, got.contiguous(), group=tp.group)
    diff = (got.float() - ref.float()).abs().max().item() if got.numel() else 0.0
    return {"exact": bool(torch.equal(got, ref)), "max_abs": diff, "ref_max": ref.float().abs().max().item(),
            "ranks_equal": all(torch.equal(gathered[0], t) for t in gathered)}


def eager_parity(tp, group, name: str) -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in SIZES:
            gen = torch.Generator(device=tp.device).manual_seed(7919 * tp.rank + n)
            x = torch.randn(n, generator=gen, device=tp.device, dtype=dtype)
            ref = x.clone()
            dist.all_reduce(ref, group=tp.group)
            got = group.all_reduce(x.clone())
            rows.append({"path": name, "dtype": str(dtype), "numel": n, "took": group.allreduce.route(x),
                         **_compare(tp, got, ref)})
    return rows


def graph_parity(tp, group, name: str) -> list[dict]:
    """Back-to-back all-reduces in one graph: independent messages of four sizes, then a dependent chain."""
    shapes = [(1, 4096), (8, 4096), (32, 4096), (3, 4096)]
    xs = [torch.zeros(s, device=tp.device, dtype=torch.bfloat16) for s in shapes]

    def body(reduce):
        outs = [reduce(x * 2) for x in xs]  # a kernel between consecutive all-reduces
        y = xs[1]
        for _ in range(3):
            y = reduce(y * 0.5 + 1)
        return outs + [y]

    stream = torch.cuda.Stream(tp.device)
    stream.wait_stream(torch.cuda.current_stream(tp.device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        body(group.all_reduce)  # eager warm-up on the capture stream
        torch.cuda.synchronize(tp.device)
        dist.barrier(group=tp.cpu_group)
        with torch.cuda.graph(graph, stream=stream):
            outs = body(group.all_reduce)
    torch.cuda.current_stream(tp.device).wait_stream(stream)
    rows = []
    for trial in range(3):
        gen = torch.Generator(device=tp.device).manual_seed(104729 * tp.rank + trial)
        for x in xs:
            x.copy_(torch.randn(x.shape, generator=gen, device=tp.device, dtype=x.dtype))
        graph.replay()
        refs = body(lambda t: (dist.all_reduce(t, group=tp.group), t)[1])
        for i, (got, ref) in enumerate(zip(outs, refs)):
            rows.append({"path": name, "trial": trial, "call": i, "took": group.allreduce.route(got),
                         **_compare(tp, got, ref)})
    del graph
    torch.cuda.synchronize(tp.device)
    return rows


def main(out: str) -> int:
    tp = init_from_env("cuda", "nccl", 60.0)
    try:
        groups = {p: setup_allreduce(tp, p, 4 << 20, torch.bfloat16, 60.0) for p in PATHS}
        result = {"ranks": tp.size, "describe": {p: g.allreduce.describe() for p, g in groups.items()},
                  "eager": [], "graph": []}
        for p, g in groups.items():
            result["eager"] += eager_parity(tp, g, p)
            result["graph"] += graph_parity(tp, g, p)
        groups.clear()
        if tp.rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        return 0
    finally:
        shutdown(tp)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
