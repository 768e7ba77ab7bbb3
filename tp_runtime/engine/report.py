"""Run reports: a short human summary, then one JSON object as the last stdout line.

The JSON line is strict JSON: a value that is not finite is written as null, next to a field saying
so (`output_checksum_finite`). A run whose outputs turned non-finite, that completed no request, or
that could not write an output prints its report and then one `error:` line, and exits 1.
"""

from __future__ import annotations

import json
import math
import sys

from tp_runtime.config import RunConfig
from tp_runtime.engine.driver import RunResult
from tp_runtime.model.cache import cache_bytes

ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def cache_bytes_per_rank(cfg: RunConfig, dtype: str) -> int:
    """Bytes of one rank's caches: runtime.max_seqs slots (+ the trash slot) x runtime.max_len positions x the
    selected layers, in the stored layout of runtime.cache_format (the caches are replicated over tp)."""
    m, rt = cfg.model, cfg.runtime
    ratios = [m.compress_ratios[i] for i in m.layer_ids()]
    return cache_bytes(m, ratios, rt.max_seqs, rt.max_len, ELEM_BYTES.get(dtype, 4), rt.cache_format == "fp8")


def run_record(cfg: RunConfig, res: RunResult, command: str = "run") -> dict:
    g = res.graph
    tokens = res.prefill_tokens + res.decode_tokens
    rec = {
        "command": command,
        "tp": cfg.parallel.tp,
        "launcher": cfg.parallel.launcher,
        "device": res.device,
        "dtype": res.dtype,
        "weight_format": cfg.runtime.weight_format,
        "fp8_activations": cfg.runtime.fp8_activations,
        "cache_format": cfg.runtime.cache_format,
        "indexer_q": cfg.runtime.indexer_q,
        "cache_bytes_per_rank": cache_bytes_per_rank(cfg, res.dtype),
        "kernels": res.kernels,
        "kernels_requested": cfg.runtime.kernels,
        "pdl": res.pdl,
        "pdl_requested": cfg.runtime.pdl,
        "streams": res.streams,
        "graph_mode": cfg.graph.mode if g else "eager",
        "graph_mode_requested": cfg.graph.mode,
        "break_scope": cfg.graph.break_scope,
        "layers": len(cfg.model.layer_ids()),
        "requests": res.completed + len(res.rejected),
        "completed": res.completed,
        "rejected": [r.reason for r in res.rejected],
        "prefill_tokens": res.prefill_tokens,
        "decode_tokens": res.decode_tokens,
        "steps": res.steps,
        "wall_s": round(res.wall_s, 4),
        "decode_step_ms_median": res.decode_step_ms_median,
        "host_ms_per_step": res.host_ms_per_step,  # the host's own work per step, median (driver.Driver)
        "host_ms_per_decode_step": res.host_ms_per_decode_step,
        "host_ms_by_part": res.host_ms_by_part_median,  # schedule, inputs, step, account: medians over steps
        "host_wait_s": res.host_wait_s,  # waiting for a pinned buffer: the host was 3 steps ahead of the GPU
        "tokens_per_s": tokens / res.wall_s if res.wall_s > 0 else None,
        "output_checksum": res.output_checksum if math.isfinite(res.output_checksum) else None,
        "output_checksum_finite": math.isfinite(res.output_checksum),
        "capture_sizes": sorted({s for k in g.values() for s in k["capture_sizes"]}, reverse=True),
        "capture_s": sum(k["capture_s"] for k in g.values()),
        "segments_per_step": max((k["segments_per_step"] for k in g.values()), default=0),
        "eager_breaks_per_step": max((k["eager_breaks_per_step"] for k in g.values()), default=0),
        "graph_pool_bytes": sum(k["graph_pool_bytes"] for k in g.values()),
        # per kind ("full", "breakable"): capture_sizes, capture_s, segments, breaks, graph_pool_bytes, and the
        # eager warm-ups' peak (warmup_bytes, released before the captures) and capture_peak_bytes
        "graphs": g,
        "replayed_fraction": res.replayed_steps / res.steps if res.steps else 0.0,
        "eager_steps": res.steps - res.replayed_steps,
        "steps_by_path": res.steps_by_path,  # full (the static decode path, replayed or eager) | breakable | eager
        "replays_by_size": {str(k): v for k, v in sorted(res.replays_by_size.items())},
    }
    rec.update({f"load_{k}": v for k, v in res.load.items()})
    rec.update(res.allreduce)  # allreduce (the path, with its threshold), allreduce_reason, ...
    return rec


def print_report(cfg: RunConfig, res: RunResult, command: str = "run") -> dict:
    rec = run_record(cfg, res, command)
    med = rec["decode_step_ms_median"]
    print(f"tp_runtime {command}: tp={rec['tp']} launcher={rec['launcher']} device={rec['device']} "
          f"dtype={rec['dtype']} cache={rec['cache_format']} kernels={rec['kernels']} graphs={_graphs_said(rec)} "
          f"layers={rec['layers']}")
    print(f"  requests {rec['completed']} completed, {len(rec['rejected'])} rejected; "
          f"{rec['prefill_tokens']} prefill + {rec['decode_tokens']} decode tokens in {rec['steps']} steps")
    for reason in rec["rejected"]:
        print(f"  rejected: {reason}")
    if rec.get("allreduce"):
        print(f"  all-reduce: {rec['allreduce']} ({rec['allreduce_reason']})")
    for kind, k in rec["graphs"].items():
        print(f"  {kind} graphs, {_sizes_said(k['capture_sizes'])}: {k['segments_per_step']} segments + "
              f"{k['eager_breaks_per_step']} eager breaks per step, capture {k['capture_s']:.2f} s, pool "
              f"{k['graph_pool_bytes'] / 2**20:.1f} MiB")
    if rec["graphs"] or rec["steps_by_path"].get("full"):
        paths = ", ".join(f"{v} {k}" for k, v in sorted(rec["steps_by_path"].items()))
        print(f"  steps: {paths}; {rec['replayed_fraction']:.0%} replayed a graph")
    parts = ", ".join(f"{k} {v:.3f}" for k, v in rec["host_ms_by_part"].items())
    waited = f"; waited {rec['host_wait_s']:.3f} s for a pinned buffer" if rec["host_wait_s"] else ""
    print(f"  host per step {_ms(rec['host_ms_per_step'])} median ({parts} ms), decode steps "
          f"{_ms(rec['host_ms_per_decode_step'])}{waited}")
    print(f"  caches {rec['cache_bytes_per_rank'] / 2**20:.1f} MiB per rank ({rec['cache_format']})")
    checksum = "NOT FINITE" if rec["output_checksum"] is None else f"{rec['output_checksum']:.6f}"
    print(f"  wall {rec['wall_s']:.3f} s, {rec['tokens_per_s'] or 0:.1f} tokens/s, decode step median "
          f"{'n/a' if med is None else f'{med:.3f} ms'}; output checksum {checksum}")
    print(strict_json(rec), flush=True)
    return rec


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


def _sizes_said(sizes: list[int]) -> str:
    """Capture sizes (largest first) as the summary says them: '1 size (64 tokens)', '13 sizes (512 ... 1 tokens)'."""
    if len(sizes) <= 1:
        return f"1 size ({sizes[0]} tokens)" if sizes else "no size"
    return f"{len(sizes)} sizes ({sizes[0]} ... {sizes[-1]} tokens)"


def _graphs_said(rec: dict) -> str:
    """The graph mode as run: the mode asked for, and whether its graphs were captured. Without CUDA the
    same step paths run eagerly (steps_by_path still counts `full` steps), so the asked mode is named."""
    asked, scope = rec["graph_mode_requested"], rec["break_scope"]
    if rec["graphs"] or asked == "eager":
        return f"{rec['graph_mode']} ({scope})"
    return f"{asked} ({scope}; not captured on {rec['device']}: run eagerly)"


def strict_json(rec: dict) -> str:
    """One line of strict JSON: non-finite floats become null (json.dumps would write NaN or Infinity,
    which JSON parsers refuse); the record carries its own field saying which value that was."""
    return json.dumps(_finite_or_null(rec), allow_nan=False)


def _finite_or_null(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite_or_null(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_or_null(x) for x in v]
    return v


def run_problems(rec: dict, res: RunResult) -> list[str]:
    """Why a run that ran to the end still failed: non-finite outputs, no request completed, an
    output that could not be written (res.errors)."""
    problems = []
    if not rec["output_checksum_finite"]:
        problems.append("the outputs turned non-finite (NaN or inf; output_checksum is null)")
    if rec["requests"] and not rec["completed"]:
        problems.append(f"no request completed: all {rec['requests']} were rejected")
    return problems + list(res.errors)


def report_and_status(cfg: RunConfig, res: RunResult, command: str = "run") -> int:
    """Print the report; then, if the run failed after all, one `error:` line. Returns the exit status."""
    problems = run_problems(print_report(cfg, res, command), res)
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr, flush=True)
        return 1
    return 0
