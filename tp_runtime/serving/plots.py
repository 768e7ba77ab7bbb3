"""Serving benchmark plots (matplotlib, Agg backend), written beside the JSON:

    ttft_vs_throughput.png   TTFT p50 (ms) vs output throughput (tokens/s), one line per mode
    tpot_vs_throughput.png   TPOT p50 (ms) vs output throughput, one line per mode

Each point is one setting (medians over rounds), joined in load order; with both closed-loop and open-loop
settings in one run each kind gets its own line per mode.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tp_runtime.paths import atomic_output  # noqa: E402
from tp_runtime.serving.report import PLOT_FILES  # noqa: E402

TITLES = {"ttft": "time to first token (p50)", "tpot": "time per output token (p50)"}


def _lines(settings: list[dict]) -> dict[str, list[dict]]:
    """Line label -> its settings in load order (the mode; with 'closed' / 'open' when both kinds ran)."""
    kinds = {s["load"] for s in settings}
    lines: dict[str, list[dict]] = {}
    for s in settings:
        label = s["mode"] if len(kinds) == 1 else f"{s['mode']} ({'closed' if s['load'] == 'concurrency' else 'open'})"
        lines.setdefault(label, []).append(s)
    return lines


def write_plots(settings: list[dict], out_dir: Path, name: str) -> list[str]:
    """Both plots of the settings that completed with a throughput; the file names written."""
    drawn = [s for s in settings if s.get("output_throughput")]
    files = []
    for metric, fname in zip(("ttft", "tpot"), PLOT_FILES):
        fig, ax = plt.subplots(figsize=(7, 4.8))
        for label, line in _lines(drawn).items():
            pts = [(s["output_throughput"], s[f"{metric}_ms_p50"], s["label"]) for s in line
                   if s[f"{metric}_ms_p50"] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            for x, y, load in pts:
                ax.annotate(load, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{metric.upper()} p50 (ms)")
        ax.set_title(f"serve-bench {name}: {TITLES[metric]}")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        try:
            with atomic_output(out_dir / fname) as tmp:
                fig.savefig(tmp, dpi=110, format="png")
        finally:
            plt.close(fig)
        files.append(fname)
    return files
