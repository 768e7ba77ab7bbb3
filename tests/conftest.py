"""Shared test helpers: run the CLI as a user would, in a subprocess, and read its JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


def run_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m tp_runtime.cli ARGS` with this checkout on PYTHONPATH; returns the finished process."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tp_runtime.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    assert lines, f"no output; stderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture
def tiny() -> str:
    return TINY
