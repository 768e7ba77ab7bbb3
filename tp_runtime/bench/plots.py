"""Benchmark plots (matplotlib, Agg backend), written beside the JSON:

    step_time_vs_batch.png       decode step median vs batch, one line per (mode, tp), a panel per context
    speedup_vs_tp.png            tp = N vs tp = 1 speedup (interleaved) with its spread, a panel per mode,
                                 the ideal line and the roofline model's speedup
    roofline_ratio_vs_context.png  measured / roofline model vs context, a panel per mode

Only seeded-cache points are drawn (the prefill-built point repeats one of them).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

from tp_runtime.bench.report import PLOT_FILES  # noqa: E402
from tp_runtime.paths import atomic_output  # noqa: E402

STEP_TIME, SPEEDUP, ROOFLINE_RATIO = PLOT_FILES


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
    return _log_lines(points, "mode", "context", "roofline_ratio", ("tp", "batch"),
                      "measured step time / roofline model", "{}", "context (tokens)", "measured / model",
                      out_dir / ROOFLINE_RATIO)


def write_plots(points: list[dict], comparisons: list[dict], out_dir: Path) -> list[str]:
    """All three plots; returns their file names."""
    return [step_time_vs_batch(points, out_dir), speedup_vs_tp(points, comparisons, out_dir),
            roofline_ratio_vs_context(points, out_dir)]
