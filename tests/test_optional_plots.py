"""write_optional_plots: off when the setting says so, and skipped with the reason when the plot module does
not import (the JSON results stand without it). The written case is checked by the bench's and serve-bench's
own tests (summary "plots": "written")."""

from __future__ import annotations

from tp_runtime.optional_plots import write_optional_plots


def test_off_and_skipped():
    assert write_optional_plots(False, "bench.plots", "tp_runtime.bench.plots") == ([], "off (bench.plots=false)")
    files, status = write_optional_plots(True, "bench.plots", "tp_runtime.no_such_plots")
    assert files == [] and status.startswith("skipped: No module named 'tp_runtime.no_such_plots'")
