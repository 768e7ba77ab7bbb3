"""DeepSeek-V4 checkpoints: every rank loads only its shard of the attention weights; synthetic ones are written.

Layout, as released for DeepSeek-V4-Flash and -Pro:

    DIR/config.json                      model keys, DSV4 names (config.py merges them into the run config)
    DIR/model.safetensors.index.json     {"metadata": {...}, "weight_map": {tensor name: file name}}
    DIR/model-0000k-of-0000n.safetensors

The big matrices (weights.TensorSpec.fp8) are float8_e4m3fn with a companion `<module>.scale` tensor of
float8_e8m0fnu bytes v, one power of two 2^(v-127) per 128x128 block, shape [ceil(out/128), ceil(in/128)]
(edge blocks partial); the rest is bf16 (norms, compressor and indexer projections) or fp32 (ape, attn_sink).

`load_checkpoint` first checks, from file headers alone, every tensor the selected layers need (name,
dtype, shape, scale shape) and reads the scale bytes of the shard; only then does it copy weights into
the stack, so a bad checkpoint leaves the stack untouched. A rank opens only the files the index names
for its tensors and reads only the rows (column-parallel) or columns (row-parallel) of its shard, then
dequantizes on its device in the run dtype (exact there: an fp8 value times a power of two).
A column range of row-parallel wo_b is a short run in every row: only those bytes are copied, but
where a run is shorter than a 4 KiB page the memory map faults in the pages of the whole tensor
(page cache, shared by the ranks of a node, released when the file is closed).

    tp-runtime write-checkpoint configs/tiny.yaml /tmp/ckpt --files 3
    tp-runtime run configs/tiny.yaml model.checkpoint=/tmp/ckpt parallel.tp=2
"""

from __future__ import annotations

import dataclasses
import json
import resource
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import safetensors
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tp_runtime.config import RUN_MODEL_KEYS, ConfigError, ModelConfig, RunConfig, checkpoint_disagreements
from tp_runtime.distributed import TPGroup, single_process
from tp_runtime.stack import AttentionStack
from tp_runtime.weights import TensorSpec, draw_full, layer_specs, model_specs, place

BLOCK = 128  # edge of a quantization block, rows and columns
FP8_MAX = 448.0  # largest finite float8_e4m3fn
INDEX = "model.safetensors.index.json"
E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7; without it the scale bytes are read raw
FP8_DTYPE, SCALE_DTYPE = "F8_E4M3", "F8_E8M0"  # safetensors dtype names
PLAIN_DTYPES = ("BF16", "F32", "F16")  # unquantized tensors (released: BF16, and F32 for ape and attn_sink)
ITEM_BYTES = {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F16": 2, "F32": 4}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded or written; the message names the tensor and the file."""


def scale_name(name: str) -> str:
    """'layers.0.attn.wq_b.weight' -> 'layers.0.attn.wq_b.scale' (the released naming)."""
    return name.removesuffix(".weight") + ".scale"


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


# ---------------------------------------------------------------- FP8 blocks


def e8m0_to_float(v: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes (uint8) -> float32 2^(v-127), exactly: v is an fp32 exponent field (v = 0 gives 2^-127)."""
    bits = (v.to(torch.int32) << 23).view(torch.float32)
    return torch.where(v == 0, 2.0 ** -127, bits)


def dequantize_fp8(q: torch.Tensor, scale_bytes: torch.Tensor, row0: int = 0, col0: int = 0,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [rows, cols] fp8 (rows row0.., columns col0.. of a matrix) times the e8m0 scales of the blocks
    covering it ([sr, sc], first block the one holding (row0, col0)) -> [rows, cols] in dtype on q's device.

    Exact in bfloat16, float32 and float64: an fp8 value times a power of two needs 4 significant bits
    and an 8-bit exponent. Any origin works: a shard starting inside a block shares its scale.
    """
    rows, cols = q.shape
    s = e8m0_to_float(scale_bytes.to(q.device)).to(dtype)
    s = s[torch.arange(row0, row0 + rows, device=q.device) // BLOCK - row0 // BLOCK]  # [rows, sc]
    w = q.to(dtype)
    if col0 % BLOCK == 0 and cols % BLOCK == 0:  # whole column blocks (every released shard): broadcast
        w.view(rows, cols // BLOCK, BLOCK).mul_(s[:, :, None])
    else:  # a block's scale per column: one [rows, cols] temporary
        w.mul_(s[:, torch.arange(col0, col0 + cols, device=q.device) // BLOCK - col0 // BLOCK])
    return w


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (float8_e4m3fn [out, in], e8m0 bytes uint8 [ceil(out/128), ceil(in/128)]).

    Each 128x128 block (edge blocks partial) gets the smallest power of two s with max|block| / s <= 448,
    so no value saturates and the largest lands in fp8's top binade.
    """
    out, inp = w.shape
    R, C = _blocks(out), _blocks(inp)
    padded = torch.zeros(R * BLOCK, C * BLOCK, dtype=torch.float32, device=w.device)
    padded[:out, :inp] = w
    blocks = padded.view(R, BLOCK, C, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))  # [R, C]
    mant, exp = torch.frexp(amax / FP8_MAX)  # amax/448 = mant * 2^exp, mant in [0.5, 1)
    k = torch.where(amax > 0, exp - (mant == 0.5).to(exp.dtype), 0).clamp(-127, 127)  # ceil(log2(amax/448))
    scale_bytes = (k + 127).to(torch.uint8)
    q = (blocks / e8m0_to_float(scale_bytes)[:, None, :, None]).view_as(padded)[:out, :inp]  # exact: / 2^k
    return q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale_bytes


# ---------------------------------------------------------------- writing synthetic checkpoints


def stored_dtype(spec: TensorSpec) -> torch.dtype:
    """Released dtype of an unquantized tensor: fp32 for ape and attn_sink, bf16 for the rest."""
    return torch.float32 if spec.kind in ("ape", "sink") else torch.bfloat16


def encode(spec: TensorSpec, full: torch.Tensor) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one spec: fp8 weight + e8m0 block scales, or the tensor in its released dtype."""
    if not spec.fp8:
        return {spec.name: full.to(stored_dtype(spec)).contiguous()}
    if E8M0 is None:
        raise CheckpointError(f"writing {spec.name} needs torch.float8_e8m0fnu (torch >= 2.7)")
    q, s = quantize_fp8(full)
    return {spec.name: q, scale_name(spec.name): s.view(E8M0)}


def stored_values(spec: TensorSpec, full: torch.Tensor) -> torch.Tensor:
    """What loading recovers from `encode(spec, full)`, in float32: full after its fp8 or bf16 round trip."""
    if spec.fp8:
        return dequantize_fp8(*quantize_fp8(full))
    return full.to(stored_dtype(spec)).float()


def checkpoint_config_json(m: ModelConfig) -> dict:
    """A DSV4 config.json for model m: its model keys plus the released quantization description."""
    d = {k: v for k, v in dataclasses.asdict(m).items() if k not in RUN_MODEL_KEYS}
    d.update(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", torch_dtype="bfloat16",
             quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "scale_fmt": "ue8m0", "weight_block_size": [BLOCK, BLOCK]})
    return d


def _split_layers(layers: list[int], n_files: int) -> list[list[int]]:
    if not 1 <= n_files <= len(layers):
        raise CheckpointError(f"--files={n_files}: a file holds whole layers, so 1 <= files <= {len(layers)} "
                              f"(the layers written)")
    per, extra = divmod(len(layers), n_files)
    bounds = [k * per + min(k, extra) for k in range(n_files + 1)]
    return [layers[bounds[k]: bounds[k + 1]] for k in range(n_files)]


def write_checkpoint(cfg: RunConfig, directory: str | Path, n_files: int = 4) -> dict:
    """Write the seeded weights of cfg's selected layers (all by default) in the released DSV4 layout.

    Layers are split into n_files contiguous groups, one file each (weights next to their scales);
    the seeded draw is the one `weights.init_seeded` uses, on the CPU. Returns a summary.
    """
    m, out = cfg.model, Path(directory)
    groups = _split_layers(m.layer_ids(), n_files)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for k, layers in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{n_files:05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for spec in (s for i in layers for s in layer_specs(m, i)):
            tensors.update(encode(spec, draw_full(spec, cfg.runtime.seed, torch.device("cpu"))))
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(checkpoint_config_json(m), indent=1) + "\n")
    return {"directory": str(out), "files": n_files, "layers": len(m.layer_ids()), "tensors": len(weight_map),
            "bytes": total}


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
        return slice(r0 // BLOCK, _blocks(r0 + rows)), slice(c0 // BLOCK, _blocks(c0 + cols))


def read_index(directory: Path) -> tuple[dict[str, str], Path]:
    """The index's weight_map (tensor name -> file name) and the index's path."""
    path = directory / INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: a DeepSeek-V4 checkpoint lists there which file holds "
                              "each tensor") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{path} has no 'weight_map' object (tensor name -> file name)")
    return weight_map, path


def _plan(m: ModelConfig, tp: TPGroup, weight_map: dict[str, str], index_path: Path) -> list[_Item]:
    """Every tensor of the selected layers, with its file(s) and this rank's bounds."""
    def file_of(name: str) -> str:
        if name not in weight_map:
            raise CheckpointError(f"tensor {name} is missing: {index_path} names no file for it")
        return weight_map[name]

    items = []
    for spec in model_specs(m):
        bounds = None if spec.shard_dim is None else tp.shard(spec.shape[spec.shard_dim], spec.name)
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
        _check_header(f, names, name, path, (SCALE_DTYPE,), (_blocks(out), _blocks(inp)), "scale tensor")
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
    it.file_bytes += _blocks(out) * _blocks(inp)


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


def _copy(stack: AttentionStack, items: list[_Item], directory: Path) -> int:
    """Read each shard, dequantize it on the stack's device, place it; returns the bytes read."""
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
                    w = dequantize_fp8(x, it.scale, *it.origin, dtype=stack.dtype) if it.spec.fp8 else x
                    place(stack, it.spec, w)
                except Exception as e:
                    raise CheckpointError(f"tensor {it.spec.name} in {path}: reading failed after the header "
                                          f"checks passed ({e})") from e
                del host, x, w
    return read


def _poison(stack: AttentionStack) -> None:
    """NaN in every parameter: a half-copied stack must never pass for a loaded one."""
    for p in stack.parameters():
        p.fill_(float("nan"))


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


def _checked_plan(m: ModelConfig, tp: TPGroup, directory: Path) -> tuple[list[_Item], list[str]]:
    """Config, index and every header checked, the shard's scales read: (what to copy, files opened)."""
    _check_config(m, directory)
    weight_map, index_path = read_index(directory)
    items = _plan(m, tp, weight_map, index_path)
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
    items, files = _checked_plan(stack.cfg, stack.tp, directory)  # all checks pass before the first copy
    with torch.no_grad():
        try:
            read = _copy(stack, items, directory)
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
