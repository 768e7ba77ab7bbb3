"""Redraw a sweep's plots from its JSON lines (points.jsonl, comparisons.jsonl in each folder given).

    python3 benchmarks/replot.py benchmarks/results/h200-2026-11-29-all-layers/scaling [more folders ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tp_runtime.bench.plots import write_plots
from tp_runtime.bench.report import read_jsonl


def _read(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args(argv)
    for folder in args.folders:
        points = _read(folder / "points.jsonl")
        if not points:
            print(f"error: {folder / 'points.jsonl'} is missing or empty", file=sys.stderr)
            return 2
        names = write_plots(points, _read(folder / "comparisons.jsonl"), folder)
        print(f"{folder}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
