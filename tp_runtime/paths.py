"""Output paths: checked before any rank starts, then written atomically.

    check_output_file(cfg.workload.dump, "workload.dump", keep=run_reads(cfg))
    check_output_dir(out_dir, "bench.output", files=("points.jsonl", "summary.json"), keep=reads)
    with atomic_output(path) as tmp:          # write tmp; it replaces path only if all went well
        save_file(tensors, str(tmp))
    write_text_atomic(out_dir / "summary.json", text)

The rule: an output only ever replaces a regular file the user named. A path (followed through
symlinks) that names a character or block device, a FIFO, a socket or a directory is refused, and
so is a path that is, or lies inside, anything the run reads (`keep`: key -> file or folder; both
sides resolved through symlinks, a folder's own entries too, and an existing file compared by device
and inode, so a hard link is caught as well). A file path written with a trailing slash names a
folder and is refused; a name or path longer than the file system allows is refused in one line.
A path passes when what it names can be made now: the nearest existing ancestor is a directory in
which a probe file can be created (and is removed at once), so a read-only file system or a missing
permission shows, for root too. Missing directories are not created by the checks.

Writes go to a fresh temporary file beside the target (same directory, so same file system), which
is flushed to disk and then renamed over the target (os.replace: readers see the old file or the new
one, never a part). A symlink at the target is replaced by the new file, never written through (one
that leads to something other than a regular file is refused, as the checks do); a replaced regular
file keeps its mode. The target is checked again just before the rename; on any failure the
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

from tp_runtime.config import ConfigError, RunConfig


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


def _read_entries(other: str | Path) -> list[Path]:
    """A path the run reads, resolved, and for a folder (a checkpoint) each entry in it resolved as well: a
    shard that is a symlink into another folder is read there."""
    r = _resolved(Path(other).expanduser())
    try:
        with os.scandir(r) as it:
            return [r, *(_resolved(Path(e.path)) for e in it)]
    except OSError:  # not a folder, or not there
        return [r]


def _refuse_reads(target: Path, key: str, path: str | Path, keep: Mapping[str, str | Path | None] | None) -> None:
    """OutputError when target (resolved) is, or lies inside, something the run reads (`keep`), or is a hard
    link to a file it reads."""
    for other_key, other in (keep or {}).items():
        if not other:
            continue
        entries = _read_entries(other)
        for r in entries:
            if target == r or _same_file(target, r):
                what = f"the same file as {other_key}={other}" if r == entries[0] else \
                    f"{r}, which {other_key}={other} holds"
                raise OutputError(f"{key}={path} is {what}; writing it would overwrite what the run reads")
            if r in target.parents:
                raise OutputError(f"{key}={path} lies inside {other_key}={other}; writing it would overwrite "
                                  f"what the run reads")


def run_reads(cfg: RunConfig, config_key: str = "CONFIG") -> dict[str, str | None]:
    """What a run reads from disk, by the key that names it: the config file, the checkpoint folder, the inputs."""
    config = cfg.source if Path(cfg.source).is_file() else None  # "<defaults>", or a sweep's "... base"
    return {config_key: config, "model.checkpoint": cfg.model.checkpoint, "workload.inputs": cfg.workload.inputs}


@contextmanager
def _in_one_line(key: str, path: str | Path) -> Iterator[None]:
    """An OSError while checking (a name or path longer than the file system allows) as one OutputError."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{key}={path}: {e.strerror or e}") from None


def check_output_file(path: str | Path, key: str, keep: Mapping[str, str | Path | None] | None = None) -> None:
    """Refuse a file path that cannot be created or replaced, that is not a regular file, that names a folder
    (a trailing slash), or that is, or lies inside, one of the paths in `keep` (key -> a file or folder the
    run reads; None or "" skips it)."""
    if str(path).endswith(("/", os.sep)):
        raise OutputError(f"{key}={path} ends with '/', so it names a folder; it must name a file")
    with _in_one_line(key, path):
        p = Path(path).expanduser()
        target = _resolved(p)
        st = _lstat(target)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{key}={path} is a directory; it must name a file")
            if not stat.S_ISREG(st.st_mode):
                raise OutputError(f"{key}={path} is {_describe(p, target, st)}; "
                                  f"an output replaces only a regular file")
            if not os.access(target, os.W_OK):
                raise OutputError(f"{key}={path} exists and is not writable")
        _refuse_reads(target, key, path, keep)
        _can_create_in(_existing_ancestor(target.parent), key, path)


def check_output_dir(path: str | Path, key: str, files: tuple[str, ...] = (),
                     keep: Mapping[str, str | Path | None] | None = None) -> None:
    """Refuse a directory path that cannot be created or filled, that is or lies inside one of the paths in
    `keep`, or in which one of the `files` it will hold exists as something other than a regular file or is
    one of the paths in `keep`."""
    with _in_one_line(key, path):
        p = Path(path).expanduser()
        target = _resolved(p)
        st = _lstat(target)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            kind = "a file" if stat.S_ISREG(st.st_mode) else _describe(p, target, st)
            raise OutputError(f"{key}={path} is {kind}; it must name a directory (created if missing)")
        _refuse_reads(target, key, path, keep)
        for name in files:
            if st is not None:
                _refuse_non_regular(target / name, f"{key}={path}: {target / name}")
            _refuse_reads(_resolved(target / name), key, f"{path}: {target / name}", keep)
        _can_create_in(_existing_ancestor(target), key, path)


# ------------------------------------------------------------------ writing


def _refuse_at_write(target: Path, path: str | Path) -> None:
    """OutputReplaceError when target is, or is a symlink that leads to, something other than a regular file
    (a symlink to a regular file, or one that leads nowhere, is replaced itself)."""
    st = _lstat(target)
    if st is not None and stat.S_ISLNK(st.st_mode):
        target, st = _resolved(target), _lstat(_resolved(target))
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputReplaceError(f"{path} is {_describe(Path(path), target, st)}; "
                                 f"an output replaces only a regular file (nothing was written)")


def _new_temp(target: Path) -> tuple[Path, int]:
    """A fresh empty file beside target, and the mode the output gets: the replaced regular file's, else
    what the umask gives a new file."""
    st = _lstat(target)
    for _ in range(100):  # a short prefix of the name: the temporary name stays within the file system's limit
        tmp = target.with_name(f".{target.name[:48]}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        mode = stat.S_IMODE((st if st is not None and stat.S_ISREG(st.st_mode) else os.fstat(fd)).st_mode)
        os.close(fd)
        return tmp, mode
    raise FileExistsError(f"no free temporary name beside {target}")


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; when the block ends without an exception it gets the
    output's mode, is synced and is renamed over `path` (a symlink there is replaced, not followed), which
    must then be absent, a regular file or a symlink to one (OutputReplaceError otherwise). On any failure
    the temporary file is removed."""
    p = Path(path).expanduser()
    target = _resolved(p.parent) / p.name  # the entry itself: its folder's symlinks followed, its own not
    _refuse_at_write(target, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, mode = _new_temp(target)
    try:
        yield tmp
        os.chmod(tmp, mode)  # a writer may have made the file anew (safetensors does, with mode 0600)
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
