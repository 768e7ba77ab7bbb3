"""Benchmark outputs: JSON lines per point and per comparison, a summary JSON, and the human tables.

    <output>/<name>/points.jsonl       one record per (variant, tp, mode, batch, context, cache fill)
    <output>/<name>/comparisons.jsonl  speedups of interleaved variants; prefill-vs-seeded agreement
    <output>/<name>/summary.json       what ran, where, with which versions, and the headline ratios

Each is written atomically (paths.atomic_output) and replaces only a regular file.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tp_runtime.paths import atomic_output

PLOT_FILES = ("step_time_vs_batch.png", "speedup_vs_tp.png", "roofline_ratio_vs_context.png")  # plots.py
# Every file a sweep may write in <output>/<name>/ (partial.jsonl and profile_view.txt: bench/loop.py).
OUTPUT_FILES = ("points.jsonl", "comparisons.jsonl", "summary.json", "partial.jsonl", "profile_view.txt",
                *PLOT_FILES)

def split_records(records: list[dict]) -> tuple[list[dict], list[dict]]:
    points = [r for r in records if r["kind"] == "point"]
    return points, [r for r in records if r["kind"] == "comparison"]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def headline(comparisons: list[dict]) -> dict:
    """Median speedup per (comparison, variant mode[, tp]) over all points: the summary's short answer."""
    groups: dict[str, list[float]] = {}
    for c in comparisons:
        key = f"{c['what']}:{c['variant_mode']}" + (f":tp{c['tp']}" if c["what"] == "tp_vs_tp1" else "")
        groups.setdefault(key, []).append(c["speedup"])
    return {k: statistics.median(v) for k, v in sorted(groups.items())}


def summary(name: str, config: str, overrides: list[str], points: list[dict], comparisons: list[dict],
            out_dir: Path, files: list[str], wall_s: float) -> dict:
    first = points[0] if points else {}
    ratios = [p["roofline_ratio"] for p in points]
    return {"command": "bench", "name": name, "config": config, "overrides": overrides,
            "points": len(points), "comparisons": len(comparisons), "output": str(out_dir), "files": files,
            "device": first.get("device"), "device_name": first.get("device_name"), "timer": first.get("timer"),
            "launcher": first.get("launcher"), "tp": sorted({p["tp"] for p in points}),
            "all_outputs_finite": all(p["outputs_finite"] for p in points),
            "roofline_ratio_median": statistics.median(ratios) if ratios else None,
            "speedups": headline(comparisons), "wall_s": round(wall_s, 2)}


def _fmt(x: float | None, width: int, prec: int) -> str:
    return "-".rjust(width) if x is None else f"{x:>{width}.{prec}f}"


def points_table(points: list[dict]) -> str:
    vw = max([7] + [len(p["variant"]) for p in points])  # the variant column fits the longest label
    head = (f"{'variant':<{vw}} {'tp':>2} {'mode':<17} {'batch':>5} {'ctx':>6} {'fill':<7} {'step ms':>9} "
            f"{'p90':>9} {'tok/s':>9} {'break':>6} {'host':>5} {'pf tok/s':>9} {'AR us':>7} {'model ms':>9} {'ratio':>6}")
    rows = [head, "-" * len(head)]
    key = lambda p: (p["variant"], p["tp"], p["context"], p["batch"], p["cache_fill"] != "seeded", p["mode"])  # noqa
    for p in sorted(points, key=key):
        ar = p["allreduce_ms_graph"] if p["allreduce_ms_graph"] is not None else p["allreduce_ms_eager"]
        rows.append(
            f"{p['variant']:<{vw}} {p['tp']:>2} {p['mode']:<17} {p['batch']:>5} {p['context']:>6} "
            f"{p['cache_fill']:<7} {p['step_ms_median']:>9.3f} {p['step_ms_p90']:>9.3f} "
            f"{p['decode_tokens_per_s']:>9.1f} {p['break_fraction']:>6.0%} {p['break_host_fraction']:>5.0%} "
            f"{_fmt(p['prefill_tokens_per_s'], 9, 1)} {ar * 1e3:>7.1f} {p['roofline_model_ms']:>9.4f} "
            f"{p['roofline_ratio']:>6.1f}")
    return "\n".join(rows)


def comparisons_table(comparisons: list[dict]) -> str:
    head = (f"{'comparison':<18} {'variant':<17} {'baseline':<22} {'tp':>2} {'batch':>5} {'ctx':>6} "
            f"{'ratio':>7}  spread (q1..q3, min..max over repeats)")
    rows = [head, "-" * len(head)]
    for c in comparisons:
        val, spread = c["speedup"], (f"{c['speedup_q1']:.3f}..{c['speedup_q3']:.3f}, "
                                     f"{c['speedup_min']:.3f}..{c['speedup_max']:.3f}")
        if "efficiency" in c:
            spread += f"; efficiency {c['efficiency']:.2f}"
        rows.append(f"{c['what']:<18} {c['variant_mode']:<17} {c['baseline']:<22} {c['tp']:>2} {c['batch']:>5} "
                    f"{c['context']:>6} {val:>7.3f}  {spread}")
    return "\n".join(rows)


def print_tables(points: list[dict], comparisons: list[dict]) -> None:
    timer = points[0]["timer"] if points else "-"
    print(f"decode step per rank (timer: {timer}; ratio = measured / roofline model; "
          "break / host = share of the step spent in eager breaks, device timeline / host clock)")
    print(points_table(points))
    if comparisons:
        print("\nspeedups: baseline time / variant time (> 1: variant faster; prefill_vs_seeded: ~1 when "
              "a cache built by real prefill decodes as fast as a seeded one)")
        print(comparisons_table(comparisons))
