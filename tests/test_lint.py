"""The lint step: ruff, configured in pyproject.toml ([tool.ruff]), over the package, the tests and the benchmarks."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes():
    if importlib.util.find_spec("ruff") is not None:
        ruff = [sys.executable, "-m", "ruff"]
    elif shutil.which("ruff"):
        ruff = [shutil.which("ruff")]
    else:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    r = subprocess.run([*ruff, "check", "--no-cache", "tp_runtime", "tests", "benchmarks"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
