"""Plots beside a sweep's JSON results (bench, serve-bench): written where matplotlib imports, skipped with
the reason where it does not (the JSON is the result), off where the setting says so."""

from __future__ import annotations

import importlib


def write_optional_plots(enabled: bool, setting: str, module: str, *args) -> tuple[list[str], str]:
    """(files written, status) for `module`.write_plots(*args): status "written", "skipped: <the import
    error>" or "off (<setting>=false)" when not enabled."""
    if not enabled:
        return [], f"off ({setting}=false)"
    try:
        plots = importlib.import_module(module)
    except ImportError as e:
        return [], f"skipped: {e}"
    return plots.write_plots(*args), "written"
