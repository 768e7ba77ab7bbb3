"""Benchmark plots (matplotlib, Agg backend), written beside the JSON:

    step_time_vs_batch.png       decode step median vs batch, one line per (mode, tp), a panel per context
    speedup_vs_tp.png            tp = N vs tp = 1 speedup (interleaved) with its spread, a panel per mode,
                                 the ideal line and the roofline model's speedup
    roofline_ratio_vs_context.png  measured / roofline model vs context, a panel per mode (records flagged
                                 roofline_ratio_below_1 left out: no result)
    projected_speedup_vs_tp.png  projected points only (grid.shard_of_tp), titled as such: projected speedup
                                 over tp 1 per shard_of_tp, a panel per mode, with the rooflines' own

Only seeded-cache points are drawn (the prefill-built point repeats one of them). Projected points never
enter the measured plots, and the measured plots are drawn only where measured points exist.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

from tp_runtime.bench.report import PLOT_FILES  # noqa: E402
from tp_runtime.paths import atomic_output  # noqa: E402

STEP_TIME, SPEEDUP, ROOFLINE_RATIO, PROJECTED_SPEEDUP = PLOT_FILES


def _panels(n: int, title: str):
    """n panels, two per row."""
    n = max(n, 1)
    cols, rows = min(n, 2), -(-n // 2)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.4 * rows), squeeze=False)
    fig.suptitle(title)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _log_x(ax, values: list) -> None:
    """Log-scaled x axis labelled at the swept values only (plain numbers, no minor labels)."""
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(values)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> str:
    """Write fig as PNG atomically (a temporary file renamed over path); returns the file name."""
    fig.tight_layout()
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path.name


def _variant_key(rows: list[dict]) -> tuple[str, ...]:
    """Name the model variant in labels only when a sweep has more than one."""
    return ("variant",) if len({r["variant"] for r in rows}) > 1 else ()


def _series(points: list[dict], x: str, y: str, label_keys: tuple[str, ...]) -> dict[str, tuple[list, list]]:
    out: dict[str, list[tuple]] = {}
    for p in points:
        label = " ".join(f"{k}={p[k]}" if k in ("tp", "batch") else str(p[k]) for k in label_keys)
        out.setdefault(label, []).append((p[x], p[y]))
    return {k: tuple(map(list, zip(*sorted(v)))) for k, v in sorted(out.items())}


def _log_lines(points: list[dict], panel: str, x: str, y: str, label_keys: tuple[str, ...], title: str,
               panel_title: str, xlabel: str, ylabel: str, path: Path) -> str:
    """Seeded points on log-log axes: a panel per value of `panel`, a line per label, x at the swept values."""
    seeded = [p for p in points if p["cache_fill"] == "seeded"]
    values = sorted({p[panel] for p in seeded})
    fig, axes = _panels(len(values), title)
    for ax, v in zip(axes, values):
        for label, (xs, ys) in _series([p for p in seeded if p[panel] == v], x, y,
                                       label_keys + _variant_key(seeded)).items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel, title=panel_title.format(v))
        _log_x(ax, [p[x] for p in seeded])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def step_time_vs_batch(points: list[dict], out_dir: Path) -> str:
    return _log_lines(points, "context", "batch", "step_ms_median", ("mode", "tp"),
                      "decode step time per rank vs batch", "context {}", "batch (sequences)",
                      "step ms (median)", out_dir / STEP_TIME)


def _model_speedup(points: list[dict], mode: str, batch: int, context: int, variant: str) -> dict[int, float]:
    """tp -> roofline model time at tp = 1 over model time at tp: what tp can buy if the step met its model."""
    model = {p["tp"]: p["roofline_model_ms"] for p in points if p["cache_fill"] == "seeded" and p["mode"] == mode
             and (p["batch"], p["context"], p["variant"]) == (batch, context, variant)}
    return {tp: model[1] / ms for tp, ms in model.items()} if 1 in model else {}


def speedup_vs_tp(points: list[dict], comparisons: list[dict], out_dir: Path) -> str:
    """A panel per mode: measured tp = N speedup (median, bar = min..max over repeats) per batch (colour)
    and context (line style), the ideal line, and the roofline model's own speedup (grey crosses)."""
    tp_cmp = [c for c in comparisons if c["what"] == "tp_vs_tp1"]
    modes = sorted({c["variant_mode"] for c in tp_cmp}) or ["(no tp > 1 points)"]
    batches, contexts = sorted({c["batch"] for c in tp_cmp}), sorted({c["context"] for c in tp_cmp})
    colours = {b: plt.cm.viridis(i / max(len(batches), 1)) for i, b in enumerate(batches)}
    styles = {ctx: ("-", "--", ":", "-.")[i % 4] for i, ctx in enumerate(contexts)}
    fig, axes = _panels(len(modes), "speedup of tp = N over tp = 1 (interleaved in one run)")
    tps = sorted({1} | {c["tp"] for c in tp_cmp})
    for ax, mode in zip(axes, modes):
        model_label = "roofline model"
        for key in sorted({(c["batch"], c["context"], c["variant"]) for c in tp_cmp if c["variant_mode"] == mode}):
            rows = sorted((c for c in tp_cmp if c["variant_mode"] == mode and
                           (c["batch"], c["context"], c["variant"]) == key), key=lambda c: c["tp"])
            xs, ys = [1] + [c["tp"] for c in rows], [1.0] + [c["speedup"] for c in rows]
            # the median of all steps may lie outside the per-repeat range: the bar then starts at the point
            lo = [0.0] + [max(0.0, c["speedup"] - c["speedup_min"]) for c in rows]
            hi = [0.0] + [max(0.0, c["speedup_max"] - c["speedup"]) for c in rows]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=colours[key[0]],
                        linestyle=styles[key[1]], label=f"batch {key[0]}, ctx {key[1]}")
            model = _model_speedup(points, mode, *key)
            ax.plot(list(model), list(model.values()), "x", color="grey", label=model_label)
            model_label = None
        ax.plot(tps, tps, "k", linewidth=0.8, alpha=0.5, label="ideal")
        ax.set(xlabel="tp", ylabel="speedup (tp=1 time / tp=N time)", title=mode, xticks=tps)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_dir / SPEEDUP)


def roofline_ratio_vs_context(points: list[dict], out_dir: Path) -> str:
    points = [p for p in points if not p.get("roofline_ratio_below_1")]
    return _log_lines(points, "mode", "context", "roofline_ratio", ("tp", "batch"),
                      "measured step time / roofline model", "{}", "context (tokens)", "measured / model",
                      out_dir / ROOFLINE_RATIO)


def projected_speedup_vs_tp(points: list[dict], out_dir: Path) -> str:
    """A panel per mode: projected speedup over tp 1 per shard_of_tp, a line per (batch, context), the
    rooflines' projected speedup (grey crosses) and the ideal line; every label says projected."""
    rows = [p for p in points if p["cache_fill"] == "seeded" and p.get("projected_speedup") is not None]
    modes = sorted({p["mode"] for p in rows}) or ["(no projected speedups)"]
    us = rows[0]["projected_allreduce_us"] if rows else 0.0
    fig, axes = _panels(len(modes), f"PROJECTED speedup over tp 1: one rank's shard alone + {us:g} us all-reduce "
                                    "per layer (not a measurement of tp k)")
    tps = sorted({p["shard_of_tp"] for p in rows}) or [1]
    for ax, mode in zip(axes, modes):
        model_label = "projected roofline"
        for key in sorted({(p["batch"], p["context"], p["variant"]) for p in rows if p["mode"] == mode}):
            line = sorted((p for p in rows if p["mode"] == mode and (p["batch"], p["context"], p["variant"]) == key),
                          key=lambda p: p["shard_of_tp"])
            xs = [p["shard_of_tp"] for p in line]
            ax.plot(xs, [p["projected_speedup"] for p in line], marker="o", label=f"batch {key[0]}, ctx {key[1]}")
            ax.plot(xs, [p["projected_roofline_speedup"] for p in line], "x", color="grey", label=model_label)
            model_label = None
        ax.plot(tps, tps, "k", linewidth=0.8, alpha=0.5, label="ideal")
        ax.set(xlabel="tp (of the projected shard)", ylabel="projected speedup", title=f"{mode} (projected)",
               xticks=tps)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_dir / PROJECTED_SPEEDUP)


def write_plots(points: list[dict], comparisons: list[dict], out_dir: Path) -> list[str]:
    """The measured plots (where measured points exist) and the projected one (where projected points exist);
    returns their file names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    measured = [p for p in points if not p.get("projected")]
    projected = [p for p in points if p.get("projected")]
    names = []
    if measured:
        names += [step_time_vs_batch(measured, out_dir),
                  speedup_vs_tp(measured, [c for c in comparisons if not c.get("projected")], out_dir),
                  roofline_ratio_vs_context(measured, out_dir)]
    if projected:
        names.append(projected_speedup_vs_tp(projected, out_dir))
    return names
