"""Refusals of settings the device must support: Triton kernels, PDL, FP8 weights and FP8 caches.

Every such refusal is phrased here, and asked with what is known of the device at each point:
- `check_kernels`, `check_pdl`, `check_fp8_formats`: runtime.device as set, from validate (every load of a
  config, so before any rank starts and again as each rank rebuilds its config);
- `check_machine`: this machine, where the launcher starts the ranks here (`run` and `check`, before any
  rank starts: runtime.device=auto on a machine without GPUs; FP8 formats and symmetric memory);
- `uses_fp8_weights`, `uses_fp8_cache`: a rank's own device, as it builds its shard (a Ray rank's node is
  known only there).
What a device can run is asked of tp_runtime/capability.py. A rank's kernel choice (ops/select.py) and its
PDL resolution (ops/kernel_support.py) raise the same sentences as check_kernels and check_pdl, from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tp_runtime.capability import (device_name, kernels_refusal, machine_device, pdl_refusal, pdl_unavailable,
                                   runs_fp8_gemms, triton_unavailable)
from tp_runtime.config.schema import RunConfig
from tp_runtime.config_yaml import ConfigError

if TYPE_CHECKING:  # the rank's device in two signatures; nothing here imports torch (capability.py asks it)
    import torch


def check_kernels(cfg: RunConfig) -> None:
    """runtime.kernels=triton where Triton or a CUDA device is missing for runtime.device."""
    if cfg.runtime.kernels != "triton":
        return
    missing = triton_unavailable(cfg.runtime.device)
    if missing is not None:
        raise ConfigError(f"{cfg.where('runtime.kernels')}: {kernels_refusal(missing)}")


def check_pdl(cfg: RunConfig) -> None:
    """runtime.pdl=on with the torch kernels (PDL launches Triton kernels), or where runtime.device cannot run it."""
    r = cfg.runtime
    if r.pdl != "on":
        return
    keys = ("runtime.pdl", "runtime.kernels") if r.kernels == "torch" else ("runtime.pdl",)
    missing = "runtime.kernels=triton or auto (PDL launches Triton kernels)" if r.kernels == "torch" \
        else pdl_unavailable(r.device)
    if missing is not None:
        raise ConfigError(f"{cfg.where(*keys)}: {pdl_refusal(missing)}")


def check_fp8_formats(cfg: RunConfig) -> None:
    """FP8 weights or caches with runtime.device=cpu: their GEMMs and cache kernels run on CUDA GPUs only."""
    r = cfg.runtime
    if r.weight_format == "fp8" and r.device == "cpu":
        raise ConfigError(f"{cfg.where('runtime.weight_format', 'runtime.device')}: 'runtime.weight_format'=fp8 runs "
                          "FP8 GEMMs on CUDA GPUs only; runtime.device=cpu (use bf16 there)")
    if r.cache_format == "fp8" and r.device == "cpu":
        raise ConfigError(f"{cfg.where('runtime.cache_format', 'runtime.device')}: 'runtime.cache_format'=fp8 stores "
                          "caches for the CUDA kernels only; runtime.device=cpu (use bf16 there)")


def check_machine(cfg: RunConfig) -> None:
    """FP8 weights or caches, or a symmetric-memory all-reduce, where the ranks start on this machine and it has no
    GPU (runtime.device=auto). Ray may place the ranks on other nodes: their devices are asked there
    (uses_fp8_weights, uses_fp8_cache, the all-reduce's own choice)."""
    r, p = cfg.runtime, cfg.parallel
    if p.launcher == "ray" or machine_device(r.device) == "cuda":
        return
    if p.allreduce.startswith("symm"):
        raise ConfigError(f"{cfg.where('parallel.allreduce')}: 'parallel.allreduce'={p.allreduce} needs CUDA GPUs "
                          "with NCCL (symmetric memory); this machine has none (use parallel.allreduce=auto or nccl)")
    if r.weight_format == "fp8":
        raise ConfigError(f"{cfg.source}: 'runtime.weight_format'=fp8 runs FP8 GEMMs on CUDA GPUs only; "
                          "this machine has none (use weight_format=bf16)")
    if r.cache_format == "fp8":
        raise ConfigError(f"{cfg.source}: 'runtime.cache_format'=fp8 stores caches for the CUDA kernels only; "
                          "this machine has none (use cache_format=bf16)")


def uses_fp8_weights(cfg: RunConfig, device: torch.device) -> bool:
    """runtime.weight_format=fp8, on a device that runs FP8 GEMMs (CUDA, compute capability >= 8.9)."""
    if cfg.runtime.weight_format != "fp8":
        return False
    if not runs_fp8_gemms(device):
        raise ConfigError(f"{cfg.source}: 'runtime.weight_format'=fp8 needs a CUDA GPU with FP8 (compute "
                          f"capability >= 8.9); this rank runs on {device} ({device_name(device)}): "
                          "use weight_format=bf16")
    return True


def uses_fp8_cache(cfg: RunConfig, device: torch.device) -> bool:
    """runtime.cache_format=fp8, on a CUDA device (the kernels that write and read the FP8 rows in place)."""
    if cfg.runtime.cache_format != "fp8":
        return False
    if device.type != "cuda":
        raise ConfigError(f"{cfg.source}: 'runtime.cache_format'=fp8 stores caches for the CUDA kernels; this rank "
                          f"runs on {device}: use cache_format=bf16")
    return True
