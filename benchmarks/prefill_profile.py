"""Where a prefill chunk's GPU time goes: one sequence's chunk of T tokens ending at a context, run eagerly,
timed and profiled by kernel group.

    python3 benchmarks/prefill_profile.py [--layers 43] [--chunks 512,2048] [--contexts 4096] [--out DIR]

Per (chunk, context): the sequence's slot is filled with seeded rows up to context - chunk (bench/cache_fill.py),
then the chunk of positions context - chunk .. context - 1 runs as one prefill step (the Triton backend, bf16,
the released Flash dims), `--iters` times (the same positions each time: the caches it writes are the same
rows), timed with CUDA events (median), then once under the profiler: GPU ms by kernel group (bench/profile.py,
the code that launched each kernel) and the largest kernels by name. Prints a table and one JSON line; writes
prefill_profile.json (and the traces) to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tp_runtime.bench.cache_fill import fill_seeded  # noqa: E402
from tp_runtime.bench.profile import GROUPS, by_kernel, group_trace, record_trace  # noqa: E402
from tp_runtime.config import load_config  # noqa: E402
from tp_runtime.engine.workload import Workload  # noqa: E402
from tp_runtime.executor.plan import SeqChunk, StepPlan  # noqa: E402
from tp_runtime.executor.worker import Worker  # noqa: E402
from tp_runtime.parallel.group import single_process  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def build(layers: int, max_tokens: int, max_len: int) -> Worker:
    cfg = load_config(ROOT / "configs/v4_flash.yaml", [
        "runtime.device=cuda", "runtime.dtype=bfloat16", "runtime.kernels=triton", "graph.mode=eager",
        f"model.num_hidden_layers={layers}", f"runtime.max_tokens_per_step={max_tokens}",
        f"runtime.prefill_chunk={max_tokens}", f"runtime.max_len={max_len}", "runtime.max_seqs=1"])
    return Worker(cfg, single_process(torch.device("cuda")))


def time_chunk(w: Worker, chunk: int, context: int, iters: int, trace: Path) -> dict:
    fill_seeded(w.caches, w.stack.ratios, 1, context - chunk, seed=0)
    plan = StepPlan((SeqChunk(0, 0, context - chunk, chunk, False),))
    x = Workload([], w.cfg.model.hidden_size, 0).step_inputs(plan, w.device, w.dtype)
    with torch.no_grad():
        for _ in range(2):  # warm-up: Triton compiles, cuBLAS picks its kernels
            w.step(plan, x)
        ms = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            w.step(plan, x)
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        tr = record_trace(lambda: w.step(plan, x), str(trace))
    kernels = [(e["name"], e.get("dur", 0.0)) for e in tr["traceEvents"] if e.get("cat") == "kernel"]
    return {"chunk": chunk, "context": context, "step_ms": statistics.median(ms), "ms_by_group": group_trace(tr, 1),
            "top_kernels": by_kernel(kernels, 1, top=15), "kernels": len(kernels)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--chunks", default="512,2048")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default="out/prefill_profile")
    a = ap.parse_args()
    chunks, contexts = [int(c) for c in a.chunks.split(",")], [int(c) for c in a.contexts.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    w = build(a.layers, max(chunks), max(contexts))
    rows = [time_chunk(w, c, ctx, a.iters, out / f"trace-{c}-{ctx}.json") for ctx in contexts for c in chunks
            if c <= ctx]
    print(f"{'chunk':>6} {'ctx':>6} {'ms':>8} " + " ".join(f"{g[:10]:>10}" for g in GROUPS))
    for r in rows:
        print(f"{r['chunk']:>6} {r['context']:>6} {r['step_ms']:8.3f} "
              + " ".join(f"{r['ms_by_group'][g]:10.3f}" for g in GROUPS))
        for k in r["top_kernels"]:
            print(f"    {k['ms']:8.3f} ms  x{k['per_step']:<5.0f} {k['kernel'][:90]}")
    res = {"layers": a.layers, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (out / "prefill_profile.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
