"""Kernels a decode layer launches, per layer kind, at rank 0's shard of tp k (one GPU, full-graph decode).

    python -m benchmarks.kernels_per_layer [--tp 1,8] [--batch 1,32] [--layers 43] [--context 4096] [--out DIR]

Per (tp, batch): rank 0's shard of tp k is built alone (bench/projection.py's shard_group: its heads and
output groups, the layer all-reduce left out), with graph.mode=full and the project's defaults (Triton kernels,
runtime.pdl=auto, runtime.streams=2). One decode step of the static path runs eagerly under the profiler with
the stack's layer ranges on (AttentionStack.annotate_layers), and `kernels_by_layer_kind` counts each layer's
kernels by kind (compress ratio 0, 4, 128): in all, on the main stream (the critical path's stream: the side
stream's branch joins before the attention, so its kernels overlap the main stream's) and on the side stream;
"step" holds the launches outside every layer (the step index, the first attn_norm, the last residual add).
Then the captured graph replays under the profiler, and its kernels per step are printed beside the eager
count: the graph holds the same launches. Prints a table and one JSON line; writes kernels_per_layer.jsonl
(bench/record_file.py) to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks import require_gpu
from tp_runtime.bench.profile import kernels_by_layer_kind, profile_steps, record_trace
from tp_runtime.bench.projection import shard_group
from tp_runtime.bench.record_file import write_records
from tp_runtime.config import load_config
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.worker import Worker

ROOT = Path(__file__).resolve().parents[1]


def count(k: int, batch: int, layers: int, context: int, extra: list[str]) -> dict:
    cfg = load_config(ROOT / "configs/v4_flash.yaml", [
        "runtime.device=cuda", "runtime.dtype=bfloat16", "runtime.kernels=triton", "graph.mode=full",
        f"model.num_hidden_layers={layers}", f"runtime.max_len={context + 64}", f"runtime.max_seqs={batch}",
        f"graph.capture_sizes=[{batch}]", *extra])
    w = Worker(cfg, shard_group(0, k, torch.device("cuda"), cfg.parallel.allreduce))
    plan = StepPlan(tuple(SeqChunk(s, s, context, 1, True) for s in range(batch)))
    x = Workload([], cfg.model.hidden_size, 0).step_inputs(plan, w.device, w.dtype)
    with torch.no_grad():
        w.stack.annotate_layers = True
        kinds = kernels_by_layer_kind(record_trace(lambda: w.step(plan, x, replay=False), None), 1)
        w.stack.annotate_layers = False
        replay = profile_steps(lambda: [w.step(plan, x) for _ in range(2)], 2, w.device)
    eager = sum(v["kernels"] * v.get("layers", 1) for v in kinds.values())
    row = {"tp": k, "batch": batch, "context": context, "pdl": w.stack.backend.pdl, "streams": w.stack.streams,
           "by_kind": kinds, "eager_kernels_per_step": eager, "replay_kernels_per_step": replay["kernels_per_step"]}
    w.release_graphs()
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", default="1,8")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default="out/kernels_per_layer")
    ap.add_argument("overrides", nargs="*", help="config overrides (e.g. runtime.streams=1)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    require_gpu(Path(__file__).name, "counts the kernels of CUDA-graph decode steps")
    rows = [count(k, b, a.layers, a.context, a.overrides) for k in map(int, a.tp.split(","))
            for b in map(int, a.batch.split(","))]
    print(f"{'tp':>3} {'batch':>5} {'kind':>5} {'layers':>6} {'kernels':>8} {'main':>6} {'side':>6} {'copies':>6}")
    for r in rows:
        for kind, v in r["by_kind"].items():
            print(f"{r['tp']:>3} {r['batch']:>5} {kind:>5} {v.get('layers', '-')!s:>6} {v['kernels']:8.1f} "
                  f"{v['main']:6.1f} {v['side']:6.1f} {v['copies']:6.1f}")
            if kind != "step":
                print("        " + ", ".join(v["names"]))
        print(f"    step: {r['eager_kernels_per_step']:.0f} kernels eagerly, {r['replay_kernels_per_step']:.0f} "
              "per graph replay")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "overrides": a.overrides, "rows": rows}
    write_records(Path(a.out) / "kernels_per_layer.jsonl", [res], settings=vars(a))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
