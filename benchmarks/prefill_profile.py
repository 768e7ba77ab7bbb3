"""Where a prefill chunk's time goes: one sequence's chunk of T tokens ending at a context, replayed on a breakable
graph and run eagerly, timed, set against the FLOP model, and profiled by kernel group.

    python -m benchmarks.prefill_profile [--layers 43] [--chunks 512,2048] [--contexts 4096] [--out DIR]

One Worker (the released Flash dims, bf16, Triton kernels, graph.mode=breakable at --scope, breakable graphs at
the chunk sizes). Per (chunk, context): the sequence's slot is filled with seeded rows up to context - chunk
(bench/cache_fill.py), then the chunk of positions context - chunk .. context - 1 runs as one prefill step,
`--iters` times on its breakable graph and as many eagerly, interleaved (the same positions each time: the
caches it writes are the same rows), timed with CUDA events (medians). TFLOP/s is the FLOP model's count
(bench/flops.py, README "Prefill throughput") over the replayed step's time, and its share of --peak. Then one
eager step under the profiler: GPU ms by kernel group (bench/profile.py, the code that launched each kernel)
and the largest kernels by name. Prints a table and one JSON line; writes prefill_profile.jsonl
(bench/record_file.py) to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from tp_runtime.bench.cache_fill import fill_seeded
from tp_runtime.bench.flops import prefill_flops
from tp_runtime.bench.profile import GROUPS, by_kernel, group_trace, record_trace
from tp_runtime.bench.record_file import write_records
from tp_runtime.config import load_config
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.worker import Worker
from tp_runtime.graph_timer import time_calls
from tp_runtime.parallel.group import single_process

ROOT = Path(__file__).resolve().parents[1]


def build(layers: int, chunks: list[int], max_len: int, scope: str) -> Worker:
    sizes = sorted(chunks, reverse=True)
    cfg = load_config(ROOT / "configs/v4_flash.yaml", [
        "runtime.device=cuda", "runtime.dtype=bfloat16", "runtime.kernels=triton", "graph.mode=breakable",
        f"graph.break_scope={scope}", f"graph.capture_sizes={sizes}", "graph.breakable_capture_sizes=[]",
        f"model.num_hidden_layers={layers}", f"runtime.max_tokens_per_step={sizes[0]}",
        f"runtime.prefill_chunk={sizes[0]}", f"runtime.max_len={max_len}", "runtime.max_seqs=1"])
    return Worker(cfg, single_process(torch.device("cuda")))


def step_ms(w: Worker, plan: StepPlan, x: torch.Tensor, replay: bool) -> float:
    runs = []
    t = time_calls(lambda: runs.append(w.step(plan, x, replay=replay)[1]), w.device, warmup=0, repeats=1)
    assert (runs[0].path == "breakable") == replay, runs[0]
    return t.median_ms


def time_chunk(w: Worker, chunk: int, context: int, iters: int, peak: float, trace: Path) -> dict:
    fill_seeded(w.caches, w.stack.ratios, 1, context - chunk, seed=0)
    plan = StepPlan((SeqChunk(0, 0, context - chunk, chunk, False),))
    x = Workload([], w.cfg.model.hidden_size, 0).step_inputs(plan, w.device, w.dtype)
    with torch.no_grad():
        for replay in (True, False, True, False):  # warm-up: Triton compiles, cuBLAS picks its kernels
            step_ms(w, plan, x, replay)
        graph, eager = [], []
        for _ in range(iters):
            graph.append(step_ms(w, plan, x, True))
            eager.append(step_ms(w, plan, x, False))
        tr = record_trace(lambda: w.step(plan, x, replay=False), str(trace))
    kernels = [(e["name"], e.get("dur", 0.0)) for e in tr["traceEvents"] if e.get("cat") == "kernel"]
    flops = prefill_flops(w.cfg.model, 1, context - chunk, chunk)
    ms = statistics.median(graph)
    return {"chunk": chunk, "context": context, "graph_ms": ms, "eager_ms": statistics.median(eager),
            "flops": flops, "tflops": flops / ms / 1e9, "peak_share": flops / ms / 1e9 / peak,
            "tokens_per_s": chunk / ms * 1e3, "ms_by_group": group_trace(tr, 1),
            "top_kernels": by_kernel(kernels, 1, top=15), "kernels": len(kernels)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--chunks", default="512,2048")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--scope", default="narrow")
    ap.add_argument("--peak", type=float, default=790.0, help="dense bf16 TFLOP/s (bench.peak_tflops)")
    ap.add_argument("--out", default="out/prefill_profile")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    chunks, contexts = [int(c) for c in a.chunks.split(",")], [int(c) for c in a.contexts.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    w = build(a.layers, chunks, max(contexts), a.scope)
    rows = [time_chunk(w, c, ctx, a.iters, a.peak, out / f"trace-{c}-{ctx}.json") for ctx in contexts
            for c in chunks if c <= ctx]
    print(f"{'chunk':>6} {'ctx':>6} {'graph ms':>8} {'eager ms':>8} {'TFLOP/s':>8} {'of peak':>7}  "
          "eager GPU ms by group: "
          + " ".join(f"{g[:10]:>10}" for g in GROUPS))
    for r in rows:
        print(f"{r['chunk']:>6} {r['context']:>6} {r['graph_ms']:8.3f} {r['eager_ms']:8.3f} {r['tflops']:8.1f} "
              f"{r['peak_share']:7.1%}  " + " ".join(f"{r['ms_by_group'][g]:10.3f}" for g in GROUPS))
        for k in r["top_kernels"]:
            print(f"    {k['ms']:8.3f} ms  x{k['per_step']:<5.0f} {k['kernel'][:90]}")
    res = {"layers": a.layers, "scope": a.scope, "peak_tflops": a.peak, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rows": rows}
    write_records(out / "prefill_profile.jsonl", [res], settings=vars(a))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
