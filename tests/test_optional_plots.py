"""write_optional_plots: off when the setting says so, skipped with the reason when the plot module does not
import (the JSON results stand without it), and, when matplotlib refuses to start (a bad MPLBACKEND) or drawing
fails, one warning line and no plot files while everything else is written. The written case is checked by the
bench's and serve-bench's own tests (summary "plots": "written")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, child_env, last_json, run_cli
from tp_runtime.optional_plots import write_optional_plots


def test_off_and_skipped():
    assert write_optional_plots(False, "bench.plots", "tp_runtime.bench.plots") == ([], "off (bench.plots=false)")
    files, status = write_optional_plots(True, "bench.plots", "tp_runtime.no_such_plots")
    assert files == [] and status.startswith("skipped: No module named 'tp_runtime.no_such_plots'")


def test_a_failure_while_drawing_warns_in_one_line_and_removes_what_it_drew(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_plots.py").write_text(
        "def write_plots(out_dir):\n"
        "    (out_dir / 'a.png').write_text('half')\n"
        "    raise RuntimeError('no font cache\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    files, status = write_optional_plots(True, "serve.plots", "broken_plots", tmp_path,
                                         files=(tmp_path / "a.png", tmp_path / "b.png"))
    assert files == [] and status == "failed: RuntimeError: no font cache"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: plots not written (RuntimeError: no font cache)"), err
    assert "serve.plots=false" in err[0] and not (tmp_path / "a.png").exists()


def test_a_bad_mplbackend_warns_instead_of_failing(tmp_path):
    code = ("from pathlib import Path; from tp_runtime.optional_plots import write_optional_plots; "
            "print(write_optional_plots(True, 'bench.plots', 'tp_runtime.bench.plots', [], [], "
            f"Path({str(tmp_path)!r})))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(MPLBACKEND="nonexistent"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith("([], ") and "failed: ValueError: Key backend: 'nonexistent'" in r.stdout, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("warning: plots not written")


def test_serve_bench_without_plots_writes_everything_else_and_never_mixes_runs(tmp_path):
    """MPLBACKEND=nonexistent: a warning line, the table and JSON printed, exit 0; the earlier run's plots and
    files are gone, not mixed with the new ones; a symlink left in the folder is replaced, its target untouched."""
    folder, outside = tmp_path / "serve_tiny", tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_text("not a result")
    for name in ("ttft_vs_throughput.png", "tpot_vs_throughput.png", "rounds.jsonl", "notes.txt"):
        (folder / name).write_text("old")
    (folder / "summary.json").symlink_to(outside)
    r = run_cli(["serve-bench", "configs/serve_tiny.yaml", "grid.modes=[breakable-narrow]", "grid.concurrency=[2]",
                 "grid.rate=[]", "serve.requests=3", "serve.repeats=1", "serve.warmup_requests=0",
                 f"serve.output={tmp_path}"], timeout_s=240, env=child_env(MPLBACKEND="nonexistent"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warnings = [x for x in r.stderr.splitlines() if x.startswith("warning: plots not written")]
    assert len(warnings) == 1 and "error:" not in r.stderr
    summ = last_json(r.stdout)
    assert "TTFT p50" in r.stdout and summ["plots"].startswith("failed: ValueError")
    assert summ["files"] == ["settings.jsonl", "rounds.jsonl", "summary.json"]
    assert sorted(os.listdir(folder)) == [".lock", "notes.txt", "rounds.jsonl", "settings.jsonl", "summary.json"]
    assert not (folder / "summary.json").is_symlink()
    assert json.loads((folder / "summary.json").read_text()) == summ and outside.read_text() == "not a result"
    assert (folder / "rounds.jsonl").read_text() != "old" and (folder / "notes.txt").read_text() == "old"
