"""What every Triton kernel file of ops/ shares: Triton itself where installed, `jit`, the SM count, the
alignment a kernel may promise for row offsets, and programmatic dependent launch (PDL).

PDL (`runtime.pdl`, CUDA compute capability >= 9.0): a kernel launched with `launch_pdl=True` may start
while the previous kernel of its stream is still running, once every program of that kernel has called
`pdl_trigger` or exited. Its programs then run their prologue (index and pointer arithmetic) and block in
`pdl_wait` until the previous kernel has completed and its writes are visible. A trigger is no memory fence:
it only lets the next kernel be scheduled, so each kernel waits before its first global load or store,
whoever wrote the memory (activations, caches, the step's metadata buffers, and, called eagerly, even
weights a preceding torch op may just have written), and triggers after its last load of such data, before
its stores. Chains stay ordered transitively: a kernel triggers only after its own wait has returned, so
its dependent starts only once the kernel before it has completed. cuBLAS GEMMs and torch ops between the
kernels take no part (they launch without the attribute and serialize as usual). Every kernel takes a
`PDL: tl.constexpr`; with PDL False both helpers compile to nothing, so the code, and its outputs, are
those of a plain launch. Graph capture keeps the programmatic edges between kernel nodes.

On CPU installs without Triton the kernel modules still import (`triton` and `tl` are None and `jit`
leaves functions as they are); their kernels cannot run, and the torch path does the work.
"""

from __future__ import annotations

import functools
import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def jit(fn):
    """triton.jit where Triton is installed, else the plain function (never called)."""
    return triton.jit(fn) if triton is not None else fn


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, which grids are sized by; an H200's 132 elsewhere
    (Triton's interpreter in the tests)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def row_align(*strides: int) -> int:
    """The largest power of two (<= 16) dividing every row stride, in elements: what a kernel may promise
    the compiler about row offsets (tl.multiple_of), so that gathered rows load as vectors (FP8 attention
    rows of 584 bytes: 8; indexer keys of 132 bytes: 4)."""
    return math.gcd(16, *strides)


@jit
def pdl_wait(PDL: tl.constexpr):
    """PDL: block until the previous kernel of the stream has completed and its writes are visible.
    Before a kernel's first global load or store."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@jit
def pdl_trigger(PDL: tl.constexpr):
    """PDL: let the next kernel of the stream launch (its programs then block in their own pdl_wait).
    After a program's last load of data an earlier kernel wrote; no fence: its own stores still follow."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


PDL_CHOICES = ("auto", "on", "off")


def _triton_has_pdl() -> bool:
    """The installed Triton launches with the PDL attribute (`launch_pdl`) and has gdc_wait / gdc_launch_dependents
    (Triton >= 3.3); its interpreter runs neither."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    gdc = getattr(getattr(tl.extra, "cuda", None), "gdc_wait", None)
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and gdc is not None


def pdl_unavailable(device: torch.device | str) -> str | None:
    """Why PDL cannot run on `device` here, or None. device: a torch.device (a rank's), or a runtime.device
    value: 'cpu', or 'auto' / 'cuda', which ask it of every visible GPU."""
    every_gpu = isinstance(device, str) and device in ("auto", "cuda")
    dev = None if every_gpu else torch.device(device)
    if dev is not None and dev.type != "cuda":
        return f"a CUDA device, but runtime.device={device}" if isinstance(device, str) else \
            f"a CUDA device; this rank runs on {dev}"
    if triton is None:
        return "the triton package, which is not installed here"
    if getattr(triton, "knobs", None) is not None and triton.knobs.runtime.interpret:
        return "compiled kernels, but TRITON_INTERPRET=1 runs Triton's interpreter"
    if not _triton_has_pdl():
        return f"a Triton with launch_pdl and gdc_wait (>= 3.3); this one is {triton.__version__}"
    if not torch.cuda.is_available():
        return "a CUDA device, and none is available here"
    ids = range(torch.cuda.device_count()) if every_gpu else [
        dev.index if dev.index is not None else torch.cuda.current_device()]
    for i in ids:
        cap = torch.cuda.get_device_capability(i)
        if cap < (9, 0):
            return (f"CUDA compute capability >= 9.0 (Hopper or newer); cuda:{i} ({torch.cuda.get_device_name(i)}) "
                    f"is {cap[0]}.{cap[1]}")
    return None


def resolve_pdl(requested: str, device: torch.device) -> bool:
    """runtime.pdl 'auto' | 'on' | 'off' -> whether the Triton kernels of a shard on `device` launch with PDL:
    auto where `pdl_unavailable` finds nothing missing. 'on' where something is raises ValueError, the message
    naming runtime.pdl (config validation refuses it before any rank starts where it can see the devices)."""
    if requested not in PDL_CHOICES:
        raise ValueError(f"'runtime.pdl' must be one of {list(PDL_CHOICES)}, got {requested!r}")
    if requested == "off":
        return False
    why = pdl_unavailable(device)
    if requested == "on" and why:
        raise ValueError(f"'runtime.pdl'=on needs {why}; use runtime.pdl=auto or off")
    return why is None
