"""The benchmark scripts' one result writer: JSON lines, each record led by the same header (the command line,
the git commit, the GPU, the torch and Triton versions and the script's settings), written atomically.

    write_records(Path(out) / "loop_overhead.jsonl", [result], settings=vars(args))

A line is {"header": {...}, **record}: the record's own keys stay as they are. The file is replaced whole
through paths.atomic_output (a temporary file beside it, synced, then renamed over it).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

import torch

from tp_runtime.paths import atomic_output

REPO = Path(__file__).resolve().parents[2]


def git_commit(repo: Path = REPO) -> str | None:
    """HEAD of the checkout the package runs from, with '-dirty' when tracked files differ; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def version_of(package: str) -> str | None:
    """An installed distribution's version, or None where it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def record_header(settings: Mapping[str, object]) -> dict:
    """What every record of this process carries: command line, commit, GPU, versions, settings."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"command": shlex.join(getattr(sys, "orig_argv", sys.argv)), "git_commit": git_commit(), "gpu": gpu,
            "torch": torch.__version__, "triton": version_of("triton"), "settings": dict(settings)}


def write_records(path: str | Path, records: Iterable[Mapping[str, object]],
                  settings: Mapping[str, object]) -> Path:
    """Replace `path` with one JSON line per record, each {"header": record_header(settings), **record}."""
    header = record_header(settings)
    lines = [json.dumps({"header": header, **record}, default=str) + "\n" for record in records]
    with atomic_output(path) as tmp:
        tmp.write_text("".join(lines))
    return Path(path)
