"""What every Triton kernel file of ops/ shares: Triton itself where installed, `jit`, the SM count, the
alignment a kernel may promise for row offsets; for the Gluon kernel files (`*_wgmma.py`) Gluon where
installed, `gjit` and `gluon_hopper`; and programmatic dependent launch (PDL): `runtime.pdl`
resolved for a device (whether a device can run PDL at all is asked of tp_runtime/capability.py:
`pdl_unavailable`, which this module re-exports).

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

from tp_runtime.capability import pdl_refusal, pdl_unavailable

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:
    gluon = gl = None


def jit(fn):
    """triton.jit where Triton is installed, else the plain function (never called)."""
    return triton.jit(fn) if triton is not None else fn


def gjit(fn):
    """gluon.jit where Gluon is installed, else the plain function (never called)."""
    return gluon.jit(fn) if gluon is not None else fn


def gl_const(v):
    """A module constant Gluon kernels may read (a Gluon global must be a constexpr); v itself without Gluon."""
    return gl.constexpr(v) if gl is not None else v


@functools.cache
def gluon_hopper(device: torch.device) -> bool:
    """The Gluon kernels (warpgroup MMAs, Hopper's TMA) can run on `device`: Gluon importable, an sm_90 GPU."""
    return gluon is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


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
    rows of 592 bytes: 16; FP8 indexer key codes of 128 bytes: 16)."""
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


@gjit
def gl_pdl_wait(PDL: gl.constexpr):
    """pdl_wait for Gluon kernels (the same instruction)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gjit
def gl_pdl_trigger(PDL: gl.constexpr):
    """pdl_trigger for Gluon kernels (the same instruction)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


PDL_CHOICES = ("auto", "on", "off")


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
        raise ValueError(pdl_refusal(why))
    return why is None
