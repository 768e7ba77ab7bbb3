"""Comparison records: speedups of interleaved lanes of one point (kind "comparison" in comparisons.jsonl).

A speedup is baseline time / variant time (> 1: the variant is faster): the ratio of the medians of all
steps, with the quartiles and min..max of the per-repeat ratios (bench/measure.py ratio_stats). Which lanes
are compared: the fixed pairs of modes and lane settings below, every tp lane against its tp = 1 baseline,
every lane against its twin that forces NCCL, and (the prefill check) prefill-built against seeded caches.
"""

from __future__ import annotations

import statistics

from tp_runtime.bench.env import BenchEnv
from tp_runtime.bench.lanes import Lane
from tp_runtime.bench.measure import flat, ratio_stats
from tp_runtime.bench.record import Point
from tp_runtime.bench.sweep_config import MODES, split_mode

Pair = tuple[str, str, str]  # (what, variant lane, baseline lane)

PAIRS: list[Pair] = [("graphs_vs_eager", m, "eager") for m in ("breakable-wide", "breakable-hoisted",
                                                               "breakable-narrow", "full", "full_and_breakable")] + [
    ("hoisted_vs_wide", "breakable-hoisted", "breakable-wide"),
    ("narrow_vs_hoisted", "breakable-narrow", "breakable-hoisted"),
    ("full_vs_narrow", "full", "breakable-narrow"),
    ("full_vs_narrow", "full_and_breakable", "breakable-narrow")] + [
    ("fp8_vs_bf16", f"{m}@fp8", m) for m in MODES] + [
    ("triton_vs_torch", f"{m}@triton", f"{m}@torch") for m in MODES] + [
    ("fp8_vs_bf16", f"{m}@fp8+triton", f"{m}@triton") for m in MODES] + [
    ("kv_fp8_vs_bf16", f"{m}@kv_fp8", base) for m in MODES for base in (m, f"{m}@kv_bf16")] + [
    ("kv_fp8_vs_bf16", f"{m}@{k}+kv_fp8", f"{m}@{k}+kv_bf16") for m in MODES for k in ("triton", "torch", "fp8")]


def point_pairs(lanes: list[Lane]) -> list[Pair]:
    """Every pair a regular point compares (those whose lanes both ran are kept by `comparisons`)."""
    return PAIRS + tp_pairs(lanes) + allreduce_pairs(lanes)


def tp_pairs(lanes: list[Lane]) -> list[Pair]:
    return [("tp_vs_tp1", lane.mode, lane.name) for lane in lanes if lane.baseline]


def allreduce_pairs(lanes: list[Lane]) -> list[Pair]:
    """("allreduce_vs_nccl", lane, its @...+nccl twin) for every main lane whose twin forces NCCL."""
    def key(mode: str) -> tuple:
        base, settings = split_mode(mode)
        return base, tuple(sorted((k, v) for k, v in (settings or {}).items() if k != "allreduce"))

    nccl = {key(lane.mode): lane.name for lane in lanes
            if not lane.baseline and (split_mode(lane.mode)[1] or {}).get("allreduce") == "nccl"}
    return [("allreduce_vs_nccl", lane.name, nccl[key(lane.mode)]) for lane in lanes
            if not lane.baseline and key(lane.mode) in nccl and nccl[key(lane.mode)] != lane.name]


def comparisons(env: BenchEnv, lanes: list[Lane], steps: dict[str, list[list[float]]], point: Point,
                pairs: list[Pair]) -> list[dict]:
    """Speedups of interleaved lanes, for each (what, variant lane, baseline lane) of pairs whose lanes both ran."""
    names = {lane.name for lane in lanes}
    return [_comparison(env, steps, point, *pair) for pair in pairs if pair[1] in names and pair[2] in names]


def _comparison(env: BenchEnv, steps: dict[str, list[list[float]]], point: Point, what: str, variant: str,
                base: str) -> dict:
    stats = ratio_stats(steps[base], steps[variant])
    rec = {"kind": "comparison", "what": what, "name": env.name, **point.to_json(), "tp": env.tp.size,
           "variant_mode": variant.removeprefix("prefill:"), "variant_lane": variant, "baseline": base,
           "device": env.machine["device"], "interleaved": True,
           "variant_ms_median": statistics.median(flat(steps[variant])),
           "baseline_ms_median": statistics.median(flat(steps[base])),
           **{k.replace("ratio", "speedup"): v for k, v in stats.items()}}
    if what == "tp_vs_tp1":
        rec["efficiency"] = rec["speedup"] / env.tp.size
    return rec
