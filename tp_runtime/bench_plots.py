"""Benchmark plots (matplotlib, Agg backend), written beside the JSON:

    step_time_vs_batch.png       decode step median vs batch, one line per (mode, tp), a panel per context
    speedup_vs_tp.png            tp = N vs tp = 1 speedup (interleaved), a panel per context, ideal line
    roofline_ratio_vs_context.png  measured / roofline model vs context, a panel per mode

Only seeded-cache points are drawn (the prefill-built point repeats one of them).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402


def _panels(n: int, title: str):
    fig, axes = plt.subplots(1, max(n, 1), figsize=(5.5 * max(n, 1), 4.2), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def _log_x(ax, values: list) -> None:
    """Log-scaled x axis labelled at the swept values only (plain numbers, no minor labels)."""
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(values)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
                      "step ms (median)", out_dir / "step_time_vs_batch.png")


def speedup_vs_tp(comparisons: list[dict], out_dir: Path) -> str:
    tp_cmp = [c for c in comparisons if c["what"] == "tp_vs_tp1"]
    contexts = sorted({c["context"] for c in tp_cmp}) or [None]
    fig, axes = _panels(len(contexts), "speedup of tp = N over tp = 1 (interleaved in one run)")
    for ax, ctx in zip(axes, contexts):
        rows = [dict(c, tp_speedup=c["speedup"]) for c in tp_cmp if c["context"] == ctx]
        # tp = 1 is the reference point (speedup 1) of every line.
        rows += [dict(r, tp=1, tp_speedup=1.0) for r in {(r["variant_mode"], r["batch"], r["variant"]): r for r in rows}.values()]
        tps = sorted({r["tp"] for r in rows}) or [1]
        for label, (xs, ys) in _series(rows, "tp", "tp_speedup",
                                       ("variant_mode", "batch") + _variant_key(rows)).items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.plot(tps, tps, "k--", linewidth=1, label="ideal")
        ax.set(xlabel="tp", ylabel="speedup (tp=1 time / tp=N time)", title=f"context {ctx}", xticks=tps)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_dir / "speedup_vs_tp.png")


def roofline_ratio_vs_context(points: list[dict], out_dir: Path) -> str:
    return _log_lines(points, "mode", "context", "roofline_ratio", ("tp", "batch"),
                      "measured step time / roofline model", "{}", "context (tokens)", "measured / model",
                      out_dir / "roofline_ratio_vs_context.png")


def write_plots(points: list[dict], comparisons: list[dict], out_dir: Path) -> list[str]:
    """All three plots; returns their file names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [step_time_vs_batch(points, out_dir), speedup_vs_tp(comparisons, out_dir),
            roofline_ratio_vs_context(points, out_dir)]
