"""The run loop against the graph it replays: decode steps through `engine.driver.Driver` (what `tp-runtime run`
runs), against back-to-back replays of the same full graph.

    python -m benchmarks.loop_overhead [--batch 1,32] [--context 4096] [--steps 50] [--repeats 3] [--out DIR]

Per batch B: one Worker (43 Flash layers, bf16, tp 1, graph.mode=full, Triton kernels, the project's defaults),
B slots filled with seeded rows as a prefill of `--context` tokens leaves them (bench/cache_fill.py). Then,
interleaved `--repeats` times:

  graph   the full graph of size B replayed `--steps` times back to back (its buffers loaded once), timed with
          CUDA events around all of them: the GPU's time per step with no host in the way
  loop    `--steps` decode steps through the Driver's own `next_plan` / `step` (schedule, inputs made on the
          device, buffer loads, replay, checksum), the B sequences already prefilled to the context; the host
          clock from the first `next_plan` to the end of the last step's GPU work (one synchronize), per step

Reports each median and loop / graph with the spread over repeats, and the Driver's host time per step by part.
Prints a table and one JSON line; writes loop_overhead.jsonl (bench/record_file.py) to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import require_gpu
from tp_runtime.bench.cache_fill import fill_seeded
from tp_runtime.bench.record_file import write_records
from tp_runtime.config import load_config
from tp_runtime.engine.driver import Driver
from tp_runtime.engine.scheduler import Scheduler
from tp_runtime.engine.workload import Request
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.worker import Worker
from tp_runtime.graph_timer import time_calls
from tp_runtime.parallel.group import single_process

ROOT = Path(__file__).resolve().parents[1]


def build(batch: int, context: int, steps: int, repeats: int) -> Worker:
    max_len = context + (repeats + 2) * (steps + 1) + 64
    cfg = load_config(ROOT / "configs/v4_flash.yaml", [
        "runtime.device=cuda", "runtime.dtype=bfloat16", "runtime.kernels=triton", "graph.mode=full",
        f"runtime.max_seqs={batch}", f"runtime.max_len={max_len}", f"graph.capture_sizes=[{batch}]",
        f"workload.requests={batch}"])
    w = Worker(cfg, single_process(torch.device("cuda")))
    fill_seeded(w.caches, w.stack.ratios, batch, context, seed=0)
    return w


def prefilled_driver(w: Worker, batch: int, pos: int, steps: int) -> Driver:
    """A Driver whose B requests are prefilled to `pos` and decode `steps` more tokens each."""
    d = Driver(w)
    d.sched = Scheduler([Request(i, pos, steps) for i in range(batch)], batch, w.cfg.runtime.max_len,
                        w.cfg.runtime.max_tokens_per_step, w.cfg.runtime.prefill_chunk)
    d.sched.next_plan()  # admits every request (a slot each); the plan itself is not run
    for s in d.sched.running:
        s.done = pos
    return d


def loop_ms(w: Worker, batch: int, pos: int, steps: int) -> tuple[float, dict]:
    d = prefilled_driver(w, batch, pos, steps)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (plan := d.next_plan()) is not None:
        d.step(plan)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    res = d.finish()
    assert res.steps == steps and res.steps_by_path == {"full": steps}, (res.steps, res.steps_by_path)
    return ms, {"host_ms_per_step": res.host_ms_per_step, "host_ms_by_part": res.host_ms_by_part_median}


def graph_ms(w: Worker, batch: int, pos: int, steps: int) -> float:
    plan = StepPlan(tuple(SeqChunk(s, s, pos, 1, True) for s in range(batch)))
    x = torch.zeros(batch, w.cfg.model.hidden_size, dtype=w.dtype, device=w.device)
    w.buffers.load(plan, x, batch, index=False)
    return time_calls(lambda: w.full_graphs.replay(batch), w.device, warmup=0, repeats=1, inner=steps).median_ms


def measure(batch: int, context: int, steps: int, repeats: int) -> dict:
    w = build(batch, context, steps, repeats)
    pos, graph, loop, host = context, [], [], []
    with torch.no_grad():
        loop_ms(w, batch, pos, 3)  # warm-up of the loop's own code paths
        pos += 3
        for _ in range(repeats):
            graph.append(graph_ms(w, batch, pos, steps))
            ms, h = loop_ms(w, batch, pos, steps)
            loop.append(ms)
            host.append(h)
            pos += steps
    ratios = [lp / g for lp, g in zip(loop, graph)]
    w.release_graphs()
    return {"batch": batch, "context": context, "steps": steps, "graph_ms": statistics.median(graph),
            "loop_ms": statistics.median(loop), "loop_vs_graph": statistics.median(ratios),
            "loop_vs_graph_min": min(ratios), "loop_vs_graph_max": max(ratios), "host": host[-1]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="out/loop_overhead")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    require_gpu(Path(__file__).name, "times CUDA graphs against the run loop")
    rows = [measure(b, a.context, a.steps, a.repeats) for b in map(int, a.batch.split(","))]
    print(f"{'batch':>5} {'ctx':>6} {'graph ms':>9} {'loop ms':>9} {'loop/graph':>10} {'spread':>13} host ms by part")
    for r in rows:
        parts = " ".join(f"{k}={v:.3f}" for k, v in r["host"]["host_ms_by_part"].items())
        print(f"{r['batch']:>5} {r['context']:>6} {r['graph_ms']:9.3f} {r['loop_ms']:9.3f} {r['loop_vs_graph']:10.3f} "
              f"{r['loop_vs_graph_min']:6.3f}-{r['loop_vs_graph_max']:.3f} {parts}")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    write_records(Path(a.out) / "loop_overhead.jsonl", [res], settings=vars(a))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
