"""What this machine and a device can run: Triton, CUDA, FP8 GEMMs, programmatic dependent launch (PDL).

Each probe answers why a feature cannot run (a phrase that completes "... needs ___"), or None where it can.
Config validation asks them before any rank starts, and the kernel choice of ops/ asks them again for a
rank's own device. This module imports nothing of the project, so every layer may ask it:

    why = triton_unavailable("auto")        # None, or "the triton package, which is not installed here"

The sentences of the two refusals that both config validation and a rank's kernel choice raise are here
too (kernels_refusal, pdl_refusal), so each reads the same wherever it is reached.

torch is imported by the probes that ask it, not with this module: a config refused before any probe runs (the
command line's `error:` lines) does not wait for torch's import (seconds).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The compute capability cuBLASLt's and Triton's FP8 e4m3 GEMMs need (Ada, Hopper and newer).
FP8_CAPABILITY = (8, 9)
# Programmatic dependent launch: Hopper or newer.
PDL_CAPABILITY = (9, 0)


def kernels_refusal(why: str) -> str:
    """The refusal of runtime.kernels=triton where `why` (a probe's answer) is missing."""
    return f"'runtime.kernels'=triton needs {why}; use runtime.kernels=torch or auto"


def pdl_refusal(why: str) -> str:
    """The refusal of runtime.pdl=on where `why` (a probe's answer) is missing."""
    return f"'runtime.pdl'=on needs {why}; use runtime.pdl=auto or off"


def triton_unavailable(device: str) -> str | None:
    """Why the Triton kernels cannot run for runtime.device=`device` here ('auto', 'cpu', 'cuda'), or None."""
    if device == "cpu":
        return "a CUDA device, but runtime.device=cpu"
    # find_spec rather than an import: asking must not load Triton (seconds) where the torch path runs.
    if importlib.util.find_spec("triton") is None:
        return "the triton package, which is not installed here"
    import torch

    if not torch.cuda.is_available():
        return f"a CUDA device, and none is available here (runtime.device={device})"
    return None


def machine_device(device: str) -> str:
    """The device type runtime.device=`device` ('auto', 'cpu', 'cuda') gives ranks started on this machine:
    auto is cuda where a GPU is visible, else cpu."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def device_name(device: torch.device) -> str:
    """A device as a person knows it: the GPU's model name, else the device type ('cpu')."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def runs_fp8_gemms(device: torch.device) -> bool:
    """The device runs FP8 e4m3 GEMMs: a CUDA GPU of compute capability >= 8.9."""
    import torch

    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_CAPABILITY


def _triton_has_pdl() -> bool:
    """The installed Triton launches with the PDL attribute (`launch_pdl`) and has gdc_wait / gdc_launch_dependents
    (Triton >= 3.3); its interpreter runs neither."""
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    gdc = getattr(getattr(tl.extra, "cuda", None), "gdc_wait", None)
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and gdc is not None


def _triton():
    """The triton module where installed, else None."""
    try:
        import triton
    except ImportError:
        return None
    return triton


def pdl_unavailable(device: torch.device | str) -> str | None:
    """Why PDL cannot run on `device` here, or None. device: a torch.device (a rank's), or a runtime.device
    value: 'cpu', or 'auto' / 'cuda', which ask it of every visible GPU."""
    import torch

    every_gpu = isinstance(device, str) and device in ("auto", "cuda")
    dev = None if every_gpu else torch.device(device)
    if dev is not None and dev.type != "cuda":
        return f"a CUDA device, but runtime.device={device}" if isinstance(device, str) else \
            f"a CUDA device; this rank runs on {dev}"
    triton = _triton()
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
        if cap < PDL_CAPABILITY:
            return (f"CUDA compute capability >= 9.0 (Hopper or newer); cuda:{i} ({torch.cuda.get_device_name(i)}) "
                    f"is {cap[0]}.{cap[1]}")
    return None
