"""Output paths, checked before any rank starts: a file a run will write, a directory it will fill.

    check_output_file(cfg.workload.dump, "workload.dump")         # OutputError naming the key
    check_output_dir("/tmp/ckpt", "write-checkpoint OUT_DIR")

A path passes when what it names can be made now: a file's path is not a directory, a directory's
is not a file, the nearest existing ancestor is a directory, and a probe file can be created (and is
removed at once) in that ancestor, so a read-only file system or a missing permission shows, for
root too. Missing directories are not created here; the writer creates them at the end.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tp_runtime.config import ConfigError


class OutputError(ConfigError):
    """An output path that cannot be written; the message names the key (or argument) and the path."""


def _existing_ancestor(p: Path) -> Path:
    """p itself or its nearest ancestor that exists (as anything: a file ends the walk too)."""
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        p = p.parent
    return p


def _can_create_in(directory: Path, key: str, path: str | Path) -> None:
    if not directory.is_dir():
        raise OutputError(f"{key}={path}: {directory} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise OutputError(f"{key}={path}: cannot create files in {directory} ({e.strerror or e})") from None


def check_output_file(path: str | Path, key: str) -> None:
    """Refuse a file path that cannot be created or replaced."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise OutputError(f"{key}={path} is a directory; it must name a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{key}={path} exists and is not writable")
    _can_create_in(_existing_ancestor(p.parent), key, path)


def check_output_dir(path: str | Path, key: str) -> None:
    """Refuse a directory path that cannot be created or filled."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{key}={path} is a file; it must name a directory (created if missing)")
    _can_create_in(_existing_ancestor(p), key, path)
