"""Reading DeepSeek-V4 checkpoints: every rank loads only its shard of the attention weights.

Layout, as released for DeepSeek-V4-Flash and -Pro: format.py. The big matrices (specs.TensorSpec.fp8)
are float8_e4m3fn with a companion `<module>.scale` tensor of float8_e8m0fnu bytes v, one power of two
2^(v-127) per 128x128 block, shape [ceil(out/128), ceil(in/128)] (edge blocks partial); the rest is bf16
(norms, compressor and indexer projections) or fp32 (ape, attn_sink). With runtime.weight_format=fp8 the
FP8 matrices are kept as stored (values and scale bytes of the shard) instead of dequantized.

`load_checkpoint` first checks, from file headers alone, every tensor the selected layers need (name,
dtype, shape, scale shape) and reads the scale bytes of the shard; only then does it copy weights into
the stack, so a bad checkpoint leaves the stack untouched. Every copied shard is then checked for NaN
and inf on the device (finite.py: one reduction per tensor, one sync at the end); a non-finite value
(a NaN bf16, an e4m3 NaN byte, garbage in the data area) is refused naming the tensor and its file.
Every file the index names must lie inside the checkpoint folder (a relative path that stays inside it);
a symlink the folder holds is followed, as in a Hugging Face cache snapshot. A rank opens only the files
the index names for its tensors and reads only the rows (column-parallel) or columns (row-parallel) of
its shard, then dequantizes on its device in the run dtype (exact there: an fp8 value times a power of two).
A column range of row-parallel wo_b is a short run in every row: only those bytes are copied, but
where a run is shorter than a 4 KiB page the memory map faults in the pages of the whole tensor
(page cache, shared by the ranks of a node, released when the file is closed).

    tp-runtime run configs/tiny.yaml model.checkpoint=/tmp/ckpt parallel.tp=2
"""

from __future__ import annotations

import json
import os
import resource
import stat
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import safetensors
import torch
from safetensors import SafetensorError, safe_open

from tp_runtime.config import ConfigError, ModelConfig, checkpoint_disagreements
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import TPGroup, single_process
from tp_runtime.weights.finite import FiniteCheck
from tp_runtime.weights.format import (
    FP8_DTYPE,
    INDEX,
    ITEM_BYTES,
    PLAIN_DTYPES,
    SCALE_DTYPE,
    CheckpointError,
    scale_name,
)
from tp_runtime.weights.fp8 import BLOCK, E8M0, dequantize_fp8, n_blocks
from tp_runtime.weights.specs import TensorSpec, is_fp8_param, model_specs, place, place_fp8, scale_blocks

# ---------------------------------------------------------------- loading: what to read


@dataclass
class _Item:
    """One checkpoint tensor a rank reads: its file, its part of the tensor, its scale bytes."""

    spec: TensorSpec
    file: str
    bounds: tuple[int, int] | None  # [lo, hi) along spec.shard_dim; None: the whole tensor
    scale_file: str | None = None
    scale: torch.Tensor | None = None  # uint8 e8m0 bytes of the blocks covering the shard (read when checked)
    file_bytes: int = 0  # bytes of the whole tensor (and its scale) in the checkpoint

    @property
    def origin(self) -> tuple[int, int]:
        """(row0, col0) of the shard inside the full matrix."""
        if self.bounds is None:
            return 0, 0
        return (self.bounds[0], 0) if self.spec.shard_dim == 0 else (0, self.bounds[0])

    @property
    def key(self) -> tuple[slice, ...]:
        """The get_slice index of the shard: rows lo:hi (dim 0) or columns lo:hi (dim 1)."""
        if self.bounds is None:
            return (slice(None),)
        return (slice(*self.bounds),) if self.spec.shard_dim == 0 else (slice(None), slice(*self.bounds))

    @property
    def shard_shape(self) -> tuple[int, ...]:
        shape = list(self.spec.shape)
        if self.bounds is not None:
            shape[self.spec.shard_dim] = self.bounds[1] - self.bounds[0]
        return tuple(shape)

    @property
    def scale_key(self) -> tuple[slice, slice]:
        """Block rows and columns of the scale tensor that cover the shard."""
        (rows, cols), (r0, c0) = self.shard_shape, self.origin
        return slice(r0 // BLOCK, n_blocks(r0 + rows)), slice(c0 // BLOCK, n_blocks(c0 + cols))


def read_index(directory: Path) -> tuple[dict[str, str], Path]:
    """The index's weight_map (tensor name -> file name, each inside directory) and the index's path."""
    path = directory / INDEX
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a directory or a FIFO: refused, never opened
            raise CheckpointError(f"{path} is not a regular file; a checkpoint's index is a JSON file")
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: a DeepSeek-V4 checkpoint lists there which file holds "
                              "each tensor") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # not JSON, not UTF-8, too deep
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{path} has no 'weight_map' object (tensor name -> file name)")
    checked: set[str] = set()
    for tensor, fname in weight_map.items():  # every entry, used by this run or not
        if not (isinstance(fname, str) and fname in checked):
            _check_entry(directory, tensor, fname, path)
            checked.add(fname)
    return weight_map, path


def _check_entry(directory: Path, tensor: str, fname: object, index_path: Path) -> None:
    """Refuse an index entry whose file is not a relative path inside directory, or is there but is not a
    regular file (followed through symlinks: a FIFO is never opened)."""
    entry = f"{index_path}: entry {tensor!r} -> {fname!r}"
    if not isinstance(fname, str) or not fname:
        raise CheckpointError(f"{entry}: a file name must be a non-empty string")
    if os.path.isabs(fname) or os.path.normpath(fname).split(os.sep)[0] == os.pardir:
        raise CheckpointError(f"{entry} names a file outside the checkpoint directory {directory}; "
                              "the index may name only files inside it")
    try:
        mode = os.stat(directory / fname).st_mode
    except OSError:
        return  # missing or unreadable: opening it names the tensor and the file
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{entry}: {directory / fname} is not a regular file")


def _plan(m: ModelConfig, tp: TPGroup, weight_map: dict[str, str], index_path: Path, fp8: bool) -> list[_Item]:
    """Every tensor of the selected layers, with its file(s) and this rank's bounds."""
    def file_of(name: str) -> str:
        if name not in weight_map:
            raise CheckpointError(f"tensor {name} is missing: {index_path} names no file for it")
        return weight_map[name]

    items = []
    for spec in model_specs(m, fp8):
        bounds = None if spec.shard_dim is None else tp.shard(spec.shape[spec.shard_dim], spec.name)
        if is_fp8_param(spec):
            try:
                scale_blocks(spec, tp)  # a shard that splits a scale block cannot keep FP8
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        items.append(_Item(spec, file_of(spec.name), bounds,
                           scale_file=file_of(scale_name(spec.name)) if spec.fp8 else None))
    return items


# ---------------------------------------------------------------- loading: checks from the headers


@contextmanager
def _open(path: Path, first: str) -> Iterator:
    """safe_open, with failures naming the file and a tensor the index placed in it."""
    try:
        handle = safe_open(str(path), framework="pt")
    except (OSError, SafetensorError) as e:
        version = tuple(int(x) for x in safetensors.__version__.split(".")[:2] if x.isdigit())
        hint = (f"; reading F8_E8M0 scale headers needs safetensors >= 0.6, this is {safetensors.__version__}"
                if version < (0, 6) else "")
        raise CheckpointError(f"{path} (which the index names for tensor {first}) cannot be opened as "
                              f"safetensors: {e}{hint}") from None
    with handle as f:
        yield f


def _check_header(f, names: set[str], name: str, path: Path, dtypes: tuple[str, ...],
                  shape: tuple[int, ...], what: str) -> str:
    """Name, dtype and shape of one tensor from the file's header; returns its dtype."""
    if name not in names:
        raise CheckpointError(f"{what} {name} is missing from {path} (the index places it in that file)")
    sl = f.get_slice(name)
    dtype, got = sl.get_dtype(), tuple(sl.get_shape())
    if dtype not in dtypes:
        raise CheckpointError(f"{what} {name} in {path} has dtype {dtype}; expected {' or '.join(dtypes)}")
    if got != tuple(shape):
        raise CheckpointError(f"{what} {name} in {path} has shape {list(got)}; expected {list(shape)}")
    return dtype


def _check_weight(f, names: set[str], it: _Item, path: Path) -> None:
    dtypes = (FP8_DTYPE,) if it.spec.fp8 else PLAIN_DTYPES
    what = "tensor" if not it.spec.fp8 else "FP8 tensor"
    dtype = _check_header(f, names, it.spec.name, path, dtypes, it.spec.shape, what)
    it.file_bytes += ITEM_BYTES[dtype] * torch.Size(it.spec.shape).numel()


def read_raw_bytes(path: Path, name: str, rows: slice, cols: slice) -> torch.Tensor:
    """Rows x columns of a 2-D tensor of 1-byte elements, read straight from the file (uint8).

    For dtypes this torch cannot represent (float8_e8m0fnu before torch 2.7): safetensors is an
    8-byte little-endian header length, a JSON header with each tensor's byte offsets, then the data.
    """
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        entry = json.loads(fh.read(n))[name]
        width = entry["shape"][1]
        fh.seek(8 + n + entry["data_offsets"][0] + rows.start * width)
        buf = bytearray(fh.read((rows.stop - rows.start) * width))
    return torch.frombuffer(buf, dtype=torch.uint8).view(-1, width)[:, cols].clone()


def _read_scale(f, names: set[str], it: _Item, path: Path) -> None:
    """Check the scale tensor's header and read the e8m0 bytes of the blocks covering the shard."""
    name, (out, inp) = scale_name(it.spec.name), it.spec.shape
    try:
        _check_header(f, names, name, path, (SCALE_DTYPE,), (n_blocks(out), n_blocks(inp)), "scale tensor")
    except CheckpointError as e:
        raise CheckpointError(f"{e} (one e8m0 scale per 128x128 block of {it.spec.name} {list(it.spec.shape)})") \
            from None
    rows, cols = it.scale_key
    if E8M0 is not None:
        it.scale = f.get_slice(name)[rows, cols].view(torch.uint8).clone()  # bytes: no e8m0 kernels needed
    else:
        it.scale = read_raw_bytes(path, name, rows, cols)
    if bool((it.scale == 255).any()):
        raise CheckpointError(f"scale tensor {name} in {path} holds NaN (e8m0 byte 0xFF) in the blocks of this shard")
    it.file_bytes += n_blocks(out) * n_blocks(inp)


def _validate(items: list[_Item], directory: Path) -> list[str]:
    """Check every needed tensor in its file's header and read the shards' scales; returns the files opened."""
    by_file: dict[str, list[tuple[str, _Item]]] = {}
    for it in items:
        by_file.setdefault(it.file, []).append(("weight", it))
        if it.spec.fp8:
            by_file.setdefault(it.scale_file, []).append(("scale", it))
    for fname, entries in by_file.items():
        path = directory / fname
        with _open(path, entries[0][1].spec.name) as f:
            names = set(f.keys())
            for role, it in entries:
                (_check_weight if role == "weight" else _read_scale)(f, names, it, path)
    return list(by_file)


# ---------------------------------------------------------------- loading: copying the shards


def _copy(stack: AttentionStack, items: list[_Item], directory: Path, check: FiniteCheck) -> int:
    """Read each shard, dequantize it on the stack's device, place it and queue its finite check;
    returns the bytes read."""
    read = 0
    for fname in dict.fromkeys(it.file for it in items):
        path, mine = directory / fname, [it for it in items if it.file == fname]
        with _open(path, mine[0].spec.name) as f:
            for it in mine:
                try:
                    host = f.get_slice(it.spec.name)[it.key]  # this rank's rows or columns only
                    if tuple(host.shape) != it.shard_shape:
                        raise CheckpointError(f"read shape {list(host.shape)}, expected {list(it.shard_shape)}")
                    read += host.numel() * host.element_size() + (it.scale.numel() if it.spec.fp8 else 0)
                    x = host.to(stack.device)
                    if is_fp8_param(it.spec):  # kept as stored: FP8 values and their scale bytes
                        w = x
                        check.add(it.spec.name, str(path), place_fp8(stack, it.spec, x, it.scale.to(stack.device)))
                    else:
                        w = dequantize_fp8(x, it.scale, *it.origin, dtype=stack.dtype) if it.spec.fp8 else x
                        check.add(it.spec.name, str(path), place(stack, it.spec, w))
                except Exception as e:
                    raise CheckpointError(f"tensor {it.spec.name} in {path}: reading failed after the header "
                                          f"checks passed ({e})") from e
                del host, x, w
    return read


def _poison(stack: AttentionStack) -> None:
    """NaN in every parameter: a half-copied stack must never pass for a loaded one."""
    for p in stack.parameters():
        p.fill_(float("nan") if p.dtype.is_floating_point else 255)  # e8m0 0xFF is NaN too


# ---------------------------------------------------------------- loading: host memory


def _proc_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class _HostPeak:
    """Growth of this process's peak resident memory during the load, in bytes.

    Linux: the high-water mark VmHWM is reset at the start (5 > /proc/self/clear_refs), so the peak is
    VmHWM at the end minus VmRSS at the start: the rank's own buffers plus the checkpoint pages that
    safetensors' memory map made resident (page cache, shared by the ranks of a node). Where the reset
    is refused: the growth of getrusage's ru_maxrss, a lower bound when an earlier peak was higher.
    """

    def __init__(self):
        self.rss0 = _proc_kib("VmRSS")
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        self.method = "ru_maxrss"
        if self.rss0 is not None:
            try:
                with open("/proc/self/clear_refs", "w") as fh:
                    fh.write("5")
                self.method = "vmhwm"
            except OSError:
                pass

    def bytes(self) -> int:
        if self.method == "vmhwm":
            return max(0, (_proc_kib("VmHWM") or 0) - self.rss0) * 1024
        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.ru0) * 1024


# ---------------------------------------------------------------- loading: entry point


def _check_config(m: ModelConfig, directory: Path) -> None:
    try:
        diffs, path = checkpoint_disagreements(m, directory)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    if diffs:
        raise CheckpointError(f"the stack's model config disagrees with {path}: " + "; ".join(diffs))


def _checked_plan(m: ModelConfig, tp: TPGroup, directory: Path, fp8: bool = False) -> tuple[list[_Item], list[str]]:
    """Config, index and every header checked, the shard's scales read: (what to copy, files opened)."""
    _check_config(m, directory)
    weight_map, index_path = read_index(directory)
    items = _plan(m, tp, weight_map, index_path, fp8)
    return items, _validate(items, directory)


def validate_checkpoint(m: ModelConfig, directory: str | Path) -> None:
    """Every check load_checkpoint makes before copying, for the whole tensors (the CLI runs this
    before any rank starts, so a bad checkpoint is refused with the tensor and file named)."""
    _checked_plan(m, single_process(torch.device("cpu")), Path(directory))


def load_checkpoint(stack: AttentionStack, directory: str | Path) -> dict:
    """Fill the stack's parameters with this rank's shard of a DSV4 checkpoint; returns the load report.

    Report keys (the run JSON shows them as load_<key>): s (seconds, device work included), files
    (opened), tensors, read_bytes (this rank's slices), checkpoint_bytes (the selected layers' tensors
    whole), param_bytes (the rank's parameters in the run dtype), host_peak_bytes, host_peak_method.
    """
    t0, peak, directory = time.perf_counter(), _HostPeak(), Path(directory)
    items, files = _checked_plan(stack.cfg, stack.tp, directory, stack.fp8)  # all checks pass before the first copy
    check = FiniteCheck()
    with torch.no_grad():
        try:
            read = _copy(stack, items, directory, check)
            check.raise_if_any()  # the load's one host sync of the checks
        except Exception:
            _poison(stack)
            raise
    if stack.device.type == "cuda":
        torch.cuda.synchronize(stack.device)
    return {
        "checkpoint": str(directory),
        "s": round(time.perf_counter() - t0, 4),
        "files": files,
        "tensors": len(items) + sum(it.spec.fp8 for it in items),
        "read_bytes": read,
        "checkpoint_bytes": sum(it.file_bytes for it in items),
        "param_bytes": sum(p.numel() * p.element_size() for p in stack.parameters()),
        "host_peak_bytes": peak.bytes(),
        "host_peak_method": peak.method,
    }
