"""Benchmark outputs: JSON lines per point and per comparison, a summary JSON, and the human tables.

    <output>/<name>/points.jsonl       one record per (variant, tp, mode, batch, context, cache fill)
    <output>/<name>/comparisons.jsonl  speedups of interleaved variants; prefill-vs-seeded agreement
    <output>/<name>/summary.json       what ran, where, with which versions, and the headline ratios

Each is written atomically (paths.atomic_output) into <name>/unfinished/, and a finished sweep moves them all up
together (results_folder.py): the folder never mixes two runs' files.
Projected points and their comparisons (`projected: true`, grid.shard_of_tp: one rank's shard alone, the
all-reduce left out; bench/projection.py) stay apart from measured ones: their own table, their own
headline keys, never a row of the measured tables. A record whose step beat its roofline model
(`roofline_ratio_below_1`) is flagged instead of shown as a ratio, and left out of the summary's median.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tp_runtime.paths import atomic_output

PLOT_FILES = ("step_time_vs_batch.png", "speedup_vs_tp.png", "roofline_ratio_vs_context.png",
              "projected_speedup_vs_tp.png")  # plots.py
# Every file a sweep may write in <output>/<name>/ (partial.jsonl: bench/entry.py; profile_view.txt and the
# traces folder: bench/steps.py): a finished sweep replaces them all (results_folder.py).
OUTPUT_FILES = ("points.jsonl", "comparisons.jsonl", "summary.json", "partial.jsonl", "profile_view.txt",
                "traces", *PLOT_FILES)

def split_records(records: list[dict]) -> tuple[list[dict], list[dict]]:
    points = [r for r in records if r["kind"] == "point"]
    return points, [r for r in records if r["kind"] == "comparison"]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def split_projected(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(measured, projected) records: projected ones say `projected: true`."""
    return [r for r in rows if not r.get("projected")], [r for r in rows if r.get("projected")]


def headline(comparisons: list[dict]) -> dict:
    """Median speedup per (comparison, variant mode[, tp]) over all points: the summary's short answer.
    Comparisons between lanes of a projected shard get keys of their own: projected:<what>:<mode>:shard_tp<k>."""
    groups: dict[str, list[float]] = {}
    for c in comparisons:
        key = f"{c['what']}:{c['variant_mode']}" + (f":tp{c['tp']}" if c["what"] == "tp_vs_tp1" else "")
        if c.get("projected"):
            key = f"projected:{key}:shard_tp{c['shard_of_tp']}"
        groups.setdefault(key, []).append(c["speedup"])
    return {k: statistics.median(v) for k, v in sorted(groups.items())}


def projected_headline(points: list[dict]) -> dict:
    """projected_speedup per (mode, shard_of_tp, batch, context) of seeded projected points."""
    return {f"{p['mode']}:tp{p['shard_of_tp']}:b{p['batch']}:ctx{p['context']}": p["projected_speedup"]
            for p in sorted(points, key=lambda p: (p["mode"], p["shard_of_tp"], p["batch"], p["context"]))
            if p["cache_fill"] == "seeded" and p.get("projected_speedup") is not None}


def summary(name: str, config: str, overrides: list[str], points: list[dict], comparisons: list[dict],
            out_dir: Path, files: list[str], wall_s: float) -> dict:
    measured, projected = split_projected(points)
    first = points[0] if points else {}
    ratios = [p["roofline_ratio"] for p in measured if not p.get("roofline_ratio_below_1")]
    out = {"command": "bench", "name": name, "config": config, "overrides": overrides,
           "points": len(measured), "comparisons": len(comparisons), "output": str(out_dir), "files": files,
           "device": first.get("device"), "device_name": first.get("device_name"), "timer": first.get("timer"),
           "launcher": first.get("launcher"), "tp": sorted({p["tp"] for p in measured}),
           "all_outputs_finite": all(p["outputs_finite"] for p in points),
           "roofline_ratio_median": statistics.median(ratios) if ratios else None,
           "roofline_ratio_below_1": sum(bool(p.get("roofline_ratio_below_1")) for p in points),
           "speedups": headline(comparisons), "wall_s": round(wall_s, 2)}
    if projected:
        out.update(projected_points=len(projected), shard_of_tp=sorted({p["shard_of_tp"] for p in projected}),
                   projected_allreduce_us=projected[0]["projected_allreduce_us"],
                   projected_speedups=projected_headline(projected))
    return out


def _fmt(x: float | None, width: int, prec: int) -> str:
    return "-".rjust(width) if x is None else f"{x:>{width}.{prec}f}"


def _ratio(p: dict, width: int = 6) -> str:
    """The roofline ratio, or the flag where it is below 1 (no result: a ceiling was mismeasured)."""
    return "!<1".rjust(width) if p.get("roofline_ratio_below_1") else f"{p['roofline_ratio']:>{width}.1f}"


FLAG_NOTE = ("!<1: the step ran faster than its roofline model allows, so a ceiling (bandwidth or all-reduce "
             "latency) was mismeasured; the record says roofline_ratio_below_1: true and is no result")


def points_table(points: list[dict]) -> str:
    vw = max([7] + [len(p["variant"]) for p in points])  # the variant column fits the longest label
    head = (f"{'variant':<{vw}} {'tp':>2} {'mode':<17} {'batch':>5} {'ctx':>6} {'fill':<7} {'step ms':>9} "
            f"{'p90':>9} {'tok/s':>9} {'break':>6} {'host':>5} {'pf tok/s':>9} {'AR us':>7} {'model ms':>9} "
            f"{'ratio':>6}")
    rows = [head, "-" * len(head)]
    key = lambda p: (p["variant"], p["tp"], p["context"], p["batch"], p["cache_fill"] != "seeded", p["mode"])  # noqa
    for p in sorted(points, key=key):
        ar = p["allreduce_ms_graph"] if p["allreduce_ms_graph"] is not None else p["allreduce_ms_eager"]
        rows.append(
            f"{p['variant']:<{vw}} {p['tp']:>2} {p['mode']:<17} {p['batch']:>5} {p['context']:>6} "
            f"{p['cache_fill']:<7} {p['step_ms_median']:>9.3f} {p['step_ms_p90']:>9.3f} "
            f"{p['decode_tokens_per_s']:>9.1f} {p['break_fraction']:>6.0%} {p['break_host_fraction']:>5.0%} "
            f"{_fmt(p['prefill_tokens_per_s'], 9, 1)} {ar * 1e3:>7.1f} {p['roofline_model_ms']:>9.4f} "
            f"{_ratio(p)}")
    return "\n".join(rows)


def projected_table(points: list[dict]) -> str:
    """Projected points: rank shard_rank's shard of tp k alone (all-reduce left out), its roofline, and the
    projected step and speedup over tp 1 at the stated all-reduce latency per layer."""
    vw = max([7] + [len(p["variant"]) for p in points])
    head = (f"{'variant':<{vw}} {'of tp':>5} {'rank':>4} {'mode':<17} {'batch':>5} {'ctx':>6} {'fill':<7} "
            f"{'rank ms':>9} {'rank roof':>9} {'ratio':>6} {'kern/step':>9} {'proj ms':>9} {'speedup':>7} "
            f"{'roof spd':>8}")
    rows = [head, "-" * len(head)]
    key = lambda p: (p["variant"], p["context"], p["batch"], p["cache_fill"] != "seeded", p["mode"],  # noqa
                     p["shard_of_tp"])
    for p in sorted(points, key=key):
        rows.append(
            f"{p['variant']:<{vw}} {p['shard_of_tp']:>5} {p['shard_rank']:>4} {p['mode']:<17} {p['batch']:>5} "
            f"{p['context']:>6} {p['cache_fill']:<7} {p['rank_step_ms']:>9.3f} {p['rank_roofline_ms']:>9.3f} "
            f"{_ratio(p)} {_fmt(p.get('kernels_per_step'), 9, 0)} {p['projected_step_ms']:>9.3f} "
            f"{_fmt(p.get('projected_speedup'), 7, 2)} {_fmt(p.get('projected_roofline_speedup'), 8, 2)}")
    return "\n".join(rows)


def bandwidth_table(points: list[dict]) -> str:
    """Points with a profile view (bench.profile on a GPU): per kernel group with a byte model
    (bench/group_bytes.py), its GPU ms a step (eager steps of the view), the bytes it must move, and
    those bytes over that time as a share of the roofline's bandwidth."""
    vw = max([7] + [len(p["variant"]) for p in points])
    head = (f"{'variant':<{vw}} {'mode':<17} {'batch':>5} {'ctx':>6} {'cache':<5} {'weights':<7} {'group':<12} "
            f"{'GPU ms':>8} {'MB':>9} {'GB/s':>7} {'share':>6}")
    rows = [head, "-" * len(head)]
    key = lambda p: (p["variant"], p["mode"], p["context"], p["batch"], p["cache_format"])  # noqa: E731
    for p in sorted((p for p in points if p.get("profile_view_bw_share")), key=key):
        for group, nbytes in p["profile_view_bytes"].items():
            ms, share = p["profile_view_ms"].get(group), p["profile_view_bw_share"].get(group)
            rate = nbytes / ms / 1e6 if ms else None  # bytes / ms / 1e6 = GB/s
            rows.append(f"{p['variant']:<{vw}} {p['mode']:<17} {p['batch']:>5} {p['context']:>6} "
                        f"{p['cache_format']:<5} {p['weight_format']:<7} {group:<12} {_fmt(ms, 8, 3)} "
                        f"{nbytes / 1e6:>9.1f} {_fmt(rate, 7, 0)} {_fmt(share and 100 * share, 5, 0)}%")
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
        tp = c["shard_of_tp"] if c.get("projected") else c["tp"]  # a projected shard: the tp it is a rank of
        rows.append(f"{c['what']:<18} {c['variant_mode']:<17} {c['baseline']:<22} {tp:>2} {c['batch']:>5} "
                    f"{c['context']:>6} {val:>7.3f}  {spread}")
    return "\n".join(rows)


def print_tables(points: list[dict], comparisons: list[dict]) -> None:
    """The measured tables, then the projected ones under their own headings; the flag's note if used."""
    timer = points[0]["timer"] if points else "-"
    (measured, projected), (m_cmp, p_cmp) = split_projected(points), split_projected(comparisons)
    if measured or not projected:
        print(f"decode step per rank (timer: {timer}; ratio = measured / roofline model; "
              "break / host = share of the step spent in eager breaks, device timeline / host clock)")
        print(points_table(measured))
    if m_cmp:
        print("\nspeedups: baseline time / variant time (> 1: variant faster; prefill_vs_seeded: ~1 when "
              "a cache built by real prefill decodes as fast as a seeded one)")
        print(comparisons_table(m_cmp))
    if projected:
        us = projected[0]["projected_allreduce_us"]
        print(f"\nPROJECTED, not measured tp (timer: {timer}): rank `rank` of tp `of tp` built alone on one device, "
              "its layer all-reduce left out; rank ms / rank roof = its step and its own roofline (its bytes over "
              f"the measured bandwidth); proj ms = rank ms + layers x {us:g} us all-reduce; speedup = proj ms of "
              "tp 1 / proj ms (roof spd: the same for the rooflines)")
        print(projected_table(projected))
    if p_cmp:
        print("\nPROJECTED shards' speedups between lanes of one shard (baseline time / variant time; tp: the "
              "tp of the shard)")
        print(comparisons_table(p_cmp))
    if any(p.get("profile_view_bw_share") for p in measured):
        print("\nbandwidth by kernel group (profile view: eager steps under the profiler; MB the group must move, "
              "share = MB / GPU ms over roofline_GBps)")
        print(bandwidth_table(measured))
    if any(p.get("roofline_ratio_below_1") for p in points):
        print(FLAG_NOTE)
