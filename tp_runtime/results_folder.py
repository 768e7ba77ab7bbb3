"""A benchmark's results folder, <output>/<name>: its name kept inside <output>, one writing run at a time, and
a run's files published together, so the folder never mixes one run's files with another's.

    folder = results_path(sweep.bench.output, sweep.name, "bench.output")  # refuses a name that escapes
    with ResultsFolder(folder, OUTPUT_FILES, "bench.output") as results:     # a second writer is refused
        write_jsonl(results.staging / "points.jsonl", points)                # <folder>/unfinished/
        results.publish()

The lock is an exclusive flock on <folder>/.lock, held while the run writes (a second run is refused in one
line naming the folder). A run writes into <folder>/unfinished/ (emptied when the lock is taken); `publish`
moves each of the command's files found there up into the folder, replacing the earlier run's file (a symlink
there is replaced, never followed), and removes the earlier run's files this run did not write. A run that
stops before publishing leaves the earlier results whole and what it had written in unfinished/. Files in the
folder that are not the command's are left alone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path, PurePath
from types import TracebackType

from tp_runtime.paths import OutputError

STAGING = "unfinished"
LOCK = ".lock"


def results_path(output: str | Path, name: str, key: str) -> Path:
    """<output>/<name>, refused (naming `name` and `key`) unless name is a relative path that stays inside
    output: not empty, not absolute, no '..', not leading out through a symlink."""
    if "\0" in name:
        raise OutputError(f"name={name!r}: a results name cannot hold a NUL byte")
    parts = PurePath(name).parts
    where = f"name={name!r}: a results name is a folder inside {key}={output}"
    if not name.strip() or not parts or PurePath(name).is_absolute() or ".." in parts:
        raise OutputError(f"{where}; it must be a non-empty relative path without '..'")
    folder = Path(output).expanduser() / name
    base = Path(os.path.realpath(Path(output).expanduser()))
    if base not in Path(os.path.realpath(folder)).parents:
        raise OutputError(f"{where}; {folder} leads to {os.path.realpath(folder)}, outside it")
    return folder


def _is_folder(p: Path) -> bool:
    """p is a folder itself (a symlink to one is not)."""
    return stat.S_ISDIR(os.lstat(p).st_mode)


def _remove(p: Path) -> None:
    """Remove whatever is at p (a folder with its contents; a symlink itself, never what it points to)."""
    if _is_folder(p):
        shutil.rmtree(p)
    else:
        p.unlink()


class ResultsFolder:
    """The lock on a results folder and its staging folder (see the module docstring)."""

    def __init__(self, folder: Path, files: tuple[str, ...], key: str,
                 keep: Mapping[str, str | Path | None] | None = None):
        self.folder, self.files, self.key = Path(folder), files, key
        self.staging = self.folder / STAGING
        self._fd: int | None = None
        staging = Path(os.path.realpath(self.staging))
        for other_key, other in (keep or {}).items():  # the staging folder is emptied: never one the run reads from
            if other and staging in Path(os.path.realpath(Path(other).expanduser())).parents:
                raise OutputError(f"{key}: {other_key}={other} lies inside {self.staging}, which a run empties; "
                                  "move it out")

    def __enter__(self) -> ResultsFolder:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise OutputError(f"{self.key}: cannot lock {self.folder / LOCK} ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.key}: {self.folder} is being written by another run (it holds "
                              f"{self.folder / LOCK}); wait for it to end or choose another name") from None
        self._fd = fd
        if os.path.lexists(self.staging):  # what an earlier run left unfinished
            _remove(self.staging)
        self.staging.mkdir()
        return self

    def publish(self) -> None:
        """Move the command's files from the staging folder up into the folder; remove the earlier run's files
        that this run did not write; remove the staging folder."""
        for name in self.files:
            new, old = self.staging / name, self.folder / name
            if os.path.lexists(old) and (not os.path.lexists(new) or _is_folder(new) or _is_folder(old)):
                _remove(old)  # the earlier run's, not replaced by this one; or a folder, which a rename cannot replace
            if os.path.lexists(new):
                os.replace(new, old)  # over a regular file or a symlink: one rename, the symlink itself replaced
        shutil.rmtree(self.staging)

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
