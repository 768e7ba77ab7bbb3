"""A folder replaced whole: the new one is written beside it under an exclusive lock, then swapped in.

    with folder_swap(Path("/data/ckpt"), "write-checkpoint OUT_DIR=/data/ckpt") as swap:
        ...                                   # write every file into swap.new
        carry_over(swap.target, swap.new, ["notes.txt"])   # entries of the old folder the new one keeps
    # a clean exit: /data/ckpt is the new folder; an exception: /data/ckpt is as it was

Beside the folder F, in its parent (one file system, so every rename is atomic):

    .F.lock   held (fcntl.flock) for the whole write: a second writer is refused at once
    .F.new    the folder being written; removed on failure, or by the next write after a crash
    .F.old    the previous F between the two renames of the swap (config.swapped_out); removed right after

The swap renames F to .F.old, then .F.new to F. An exception between the two puts .F.old back. A crash
(SIGKILL, power) between them leaves no F and .F.old whole: the next write puts it back before it starts
(and says so), and a load names it. Readers never see a folder that mixes the old files and the new.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tp_runtime.config import swapped_out
from tp_runtime.paths import OutputError


@dataclass
class FolderSwap:
    """One write in progress: the folder it replaces, the one it fills, what it found left by others."""

    target: Path
    new: Path
    notes: list[str] = field(default_factory=list)  # leftovers of an interrupted write, and what became of them


@contextmanager
def folder_swap(target: Path, shown: str) -> Iterator[FolderSwap]:
    """Lock, clear an interrupted write's leftovers, yield an empty sibling folder to fill, swap it in on a
    clean exit; on any failure remove it and leave target as it was. `shown` leads every error message."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(target):
        raise OutputError(f"{shown}: {target} is a mount point; the write swaps in a new folder by renaming it, "
                          "so name a folder inside it")
    lock_path = target.parent / f".{target.name}.lock"
    fd = _lock(lock_path, shown, target)
    try:
        swap = FolderSwap(target, target.parent / f".{target.name}.new", _recover(target))
        try:
            os.mkdir(swap.new)
            if os.path.isdir(target):  # the new folder keeps the old one's permissions
                os.chmod(swap.new, stat.S_IMODE(os.stat(target).st_mode))
            yield swap
            _swap_in(swap.new, target, shown)
        finally:
            _remove(swap.new)  # gone already after a swap
            if os.path.lexists(target):  # else .F.old is the only whole folder: the next write restores it
                _remove(swapped_out(target))
    finally:
        lock_path.unlink(missing_ok=True)  # before the unlock: a writer that opened it retries with a fresh one
        os.close(fd)


def carry_over(old: Path, new: Path, names: Iterable[str]) -> None:
    """Give `new` the entries `names` of `old` as they are, leaving `old` whole: files as hard links (a copy
    where the file system refuses one), symlinks as symlinks, folders recreated with their contents."""
    for name in names:
        src, dst = old / name, new / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _lock(path: Path, shown: str, target: Path) -> int:
    """An exclusive flock on path (created if missing), or OutputError at once when another writer holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise OutputError(f"{shown}: cannot create the lock file {path} ({e.strerror or e}); the write goes to "
                              f"a new folder beside {target} and is then swapped in, so its parent must be "
                              "writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if isinstance(e, BlockingIOError):
                raise OutputError(f"{shown}: another write-checkpoint is writing {target} now (it holds {path}); "
                                  "nothing was written") from None
            raise OutputError(f"{shown}: cannot lock {path} ({e.strerror or e})") from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed that lock file as it finished: lock the current one


def _recover(target: Path) -> list[str]:
    """Undo what a crashed write left beside target (the lock is held, so no write is running)."""
    notes, old, new = [], swapped_out(target), target.parent / f".{target.name}.new"
    if os.path.lexists(old):
        if os.path.lexists(target):  # the crash came after the swap: target is the newer folder, whole
            _remove(old)
            notes.append(f"removed {old}: the folder an earlier, interrupted write had swapped out")
        else:  # the crash came between the two renames
            os.rename(old, target)
            notes.append(f"restored {target} from {old}: an earlier write was interrupted while swapping "
                         "folders; its new folder is discarded")
    if os.path.lexists(new):
        _remove(new)
        notes.append(f"removed {new}: the unfinished folder of an earlier, interrupted write")
    return notes


def _swap_in(new: Path, target: Path, shown: str) -> None:
    """target := new, by two renames; an exception between them (a signal) puts the old target back."""
    old = swapped_out(target)
    had_old = os.path.lexists(target)
    try:
        _fsync_dir(new)
        if had_old:
            os.rename(target, old)
        os.rename(new, target)
    except BaseException as e:
        if had_old and not os.path.lexists(target):
            os.rename(old, target)
        if isinstance(e, OSError):
            raise OutputError(f"{shown}: cannot swap the new folder {new} in for {target} "
                              f"({e.strerror or e}); {target} is as it was") from None
        raise
    _fsync_dir(target.parent)


def _fsync_dir(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(p: Path) -> None:
    """Remove p, a folder with its contents or anything else; nothing there is fine."""
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.unlink(p)
