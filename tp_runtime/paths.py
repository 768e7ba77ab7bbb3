"""Output paths: checked before any rank starts, then written atomically.

    check_output_file(cfg.workload.dump, "workload.dump", keep={"workload.inputs": cfg.workload.inputs})
    check_output_dir(out_dir, "bench.output", files=("points.jsonl", "summary.json"))
    with atomic_output(path) as tmp:          # write tmp; it replaces path only if all went well
        save_file(tensors, str(tmp))
    write_text_atomic(out_dir / "summary.json", text)

The rule: an output only ever replaces a regular file the user named. A path (followed through
symlinks) that names a character or block device, a FIFO, a socket or a directory is refused, and
so is a file the run reads (`keep`, compared by device and inode, so a hard link or a symlink is
caught too). A path passes when what it names can be made now: the nearest existing ancestor is a
directory in which a probe file can be created (and is removed at once), so a read-only file system
or a missing permission shows, for root too. Missing directories are not created by the checks.

Writes go to a fresh temporary file beside the target (same directory, so same file system), which
is flushed to disk and then renamed over the target (os.replace: readers see the old file or the new
one, never a part). The target is checked again just before the rename; on any failure the
temporary file is removed and the previous file is left as it was.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tp_runtime.config import ConfigError


class OutputError(ConfigError):
    """An output path that cannot be written; the message names the key (or argument) and the path."""


class OutputReplaceError(OSError):
    """At write time the target was not a regular file any more; nothing was replaced."""


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink loop"}


def _lstat(p: Path) -> os.stat_result | None:
    """p's own status (a symlink is not followed), or None when nothing is there."""
    try:
        return os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _resolved(p: Path) -> Path:
    """p with every symlink followed (the entry a write would replace); a loop stays a symlink."""
    return Path(os.path.realpath(p))


def _describe(p: Path, target: Path, st: os.stat_result) -> str:
    """'a FIFO', or 'a FIFO (via symlink: /real/path)' when p reaches it through a symlink."""
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
    return f"{kind} (via symlink: {target})" if os.path.islink(p) and target != p else kind


def _refuse_non_regular(p: Path, shown: str) -> None:
    """OutputError when p (followed through symlinks) exists and is not a regular file; `shown` leads the message."""
    target = _resolved(p)
    st = _lstat(target)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{shown} is {_describe(p, target, st)}; an output replaces only a regular file")


def _existing_ancestor(p: Path) -> Path:
    """p itself or its nearest ancestor that exists (as anything: a file ends the walk too)."""
    while _lstat(p) is None and p != p.parent:
        p = p.parent
    return p


def _can_create_in(directory: Path, key: str, path: str | Path) -> None:
    """Refuse unless directory (an existing entry) is a directory in which a file can be created now."""
    st = _lstat(_resolved(directory))
    if st is None or not stat.S_ISDIR(st.st_mode):
        kind = "a symlink that does not resolve" if st is None else _KINDS.get(stat.S_IFMT(st.st_mode), "a file")
        raise OutputError(f"{key}={path}: {directory} is {kind}, not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise OutputError(f"{key}={path}: cannot create files in {directory} ({e.strerror or e})") from None


def _same_file(a: Path, b: str | Path) -> bool:
    """a and b name one file (device and inode; symlinks followed); False when either is missing."""
    try:
        sa, sb = os.stat(a), os.stat(Path(b).expanduser())
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output_file(path: str | Path, key: str, keep: Mapping[str, str | Path | None] | None = None) -> None:
    """Refuse a file path that cannot be created or replaced, that is not a regular file, or that is
    one of the files in `keep` (key -> path of a file the run reads; None or "" skips it)."""
    p = Path(path).expanduser()
    target = _resolved(p)
    st = _lstat(target)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{key}={path} is a directory; it must name a file")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{key}={path} is {_describe(p, target, st)}; an output replaces only a regular file")
        if not os.access(target, os.W_OK):
            raise OutputError(f"{key}={path} exists and is not writable")
        for other_key, other in (keep or {}).items():
            if other and _same_file(target, other):
                raise OutputError(f"{key}={path} is the same file as {other_key}={other}; "
                                  f"writing it would overwrite that input")
    _can_create_in(_existing_ancestor(target.parent), key, path)


def check_output_dir(path: str | Path, key: str, files: tuple[str, ...] = ()) -> None:
    """Refuse a directory path that cannot be created or filled, or in which one of the `files` it
    will hold exists as something other than a regular file."""
    p = Path(path).expanduser()
    target = _resolved(p)
    st = _lstat(target)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else _describe(p, target, st)
        raise OutputError(f"{key}={path} is {kind}; it must name a directory (created if missing)")
    if st is not None:
        for name in files:
            _refuse_non_regular(target / name, f"{key}={path}: {target / name}")
    _can_create_in(_existing_ancestor(target), key, path)


# ------------------------------------------------------------------ writing


def _refuse_at_write(target: Path, path: str | Path) -> None:
    st = _lstat(target)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputReplaceError(f"{path} is {_describe(Path(path), target, st)}; "
                                 f"an output replaces only a regular file (nothing was written)")


def _new_temp(target: Path) -> Path:
    """A fresh empty file beside target: the umask's mode, or the replaced file's."""
    st = _lstat(target)
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        if st is not None:
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name beside {target}")


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (followed through symlinks) to write; when the block ends
    without an exception it is synced and renamed over the target, which must then be absent or a
    regular file (OutputReplaceError otherwise). On any failure the temporary file is removed."""
    target = _resolved(Path(path).expanduser())
    _refuse_at_write(target, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp(target)
    try:
        yield tmp
        _fsync(tmp)
        _refuse_at_write(target, path)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through atomic_output."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)
