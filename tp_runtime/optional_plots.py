"""Plots beside a sweep's JSON results (bench, serve-bench): written where matplotlib imports and draws, skipped
with the reason where it does not import, and where drawing fails (a bad MPLBACKEND, a broken font cache, a full
disk) a one-line warning and no plot files: the JSON and the tables are the result, so they never depend on the
plots. Off where the setting says so."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def write_optional_plots(enabled: bool, setting: str, module: str, *args, files: tuple[Path, ...] = ()
                         ) -> tuple[list[str], str]:
    """(files written, status) for `module`.write_plots(*args): status "written", "skipped: <the import error>",
    "failed: <the error>" (warned on stderr; any of `files`, the plots it may have written, removed) or
    "off (<setting>=false)" when not enabled."""
    if not enabled:
        return [], f"off ({setting}=false)"
    try:
        plots = importlib.import_module(module)
    except ImportError as e:
        return [], f"skipped: {e}"
    except Exception as e:  # noqa: BLE001 - matplotlib refuses a bad MPLBACKEND with a ValueError at import
        return [], _failed(e, setting, files)
    try:
        return plots.write_plots(*args), "written"
    except Exception as e:  # noqa: BLE001 - any failure to draw leaves the results without plots, not lost
        return [], _failed(e, setting, files)


def _failed(e: Exception, setting: str, files: tuple[Path, ...]) -> str:
    for f in files:  # a plot drawn before the failure would not be listed in the summary
        f.unlink(missing_ok=True)
    reason = (str(e).splitlines() or [""])[0][:300] or type(e).__name__
    print(f"warning: plots not written ({type(e).__name__}: {reason}); the results are complete without them "
          f"({setting}=false turns them off)", file=sys.stderr, flush=True)
    return f"failed: {type(e).__name__}: {reason}"
