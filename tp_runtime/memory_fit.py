"""Each rank's memory against its device's, checked before any rank starts.

    check_memory(cfg)          # `run`, `check`: ConfigError naming the keys and the sizes, or nothing

A rank holds its weights (this rank's shard), its caches (runtime.max_seqs + the trash slot, each
runtime.max_len positions, over the selected layers) and a workspace (rotary tables and one step's
activations at the step buffers' token rows, which the CUDA graph pool holds under graphs), all from
memory_model.py. The budget is the device's:

  CUDA  the total memory of the smallest GPU a rank of this machine may use (GPUs 0..tp-1), as torch
        reports it; read from the device properties, so no CUDA context is made in this process.
  CPU   the host's available memory (/proc/meminfo MemAvailable, else the physical pages), shared by
        the ranks that run here: every rank under the local launcher and an embedded Ray.

Ranks on a Ray cluster (RAY_ADDRESS) run on nodes this machine cannot see: there nothing is checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tp_runtime.config import ConfigError, RunConfig
from tp_runtime.memory_model import rank_memory

# The keys that set each part of a rank's memory, and what lowers it, named when it does not fit.
PART_KEYS = {"weights": ("model.layers", "parallel.tp", "runtime.dtype", "runtime.weight_format"),
             "caches": ("runtime.max_seqs", "runtime.max_len", "model.layers", "runtime.cache_format"),
             "workspace": ("runtime.max_tokens_per_step", "graph.capture_sizes", "runtime.max_len")}
ADVICE = {"weights": "select fewer layers (model.layers) or raise parallel.tp",
          "caches": "lower runtime.max_seqs or runtime.max_len, or select fewer layers (model.layers)",
          "workspace": "lower runtime.max_tokens_per_step, graph.capture_sizes or runtime.max_len"}


@dataclass(frozen=True)
class Budget:
    bytes: int
    what: str  # e.g. "GPU 0 (NVIDIA H200) has 139.8 GiB"
    ranks_here: int  # ranks that share it (CPU: all of this machine's; CUDA: one per GPU)


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1: '1.5 MiB', '7.3 PiB'."""
    unit = next(u for u in range(6, -1, -1) if n >= 1024**u or u == 0)
    return f"{n / 1024**unit:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'][unit]}"


def device_type(cfg: RunConfig) -> str:
    """Where the ranks run: runtime.device, with auto resolved as a rank resolves it (parallel/group.py)."""
    import torch

    if cfg.runtime.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.runtime.device


def device_budget(cfg: RunConfig, device_type: str) -> Budget | None:
    """What the ranks of this run have on this machine; None where they run elsewhere (a Ray cluster)."""
    if cfg.parallel.launcher == "ray" and os.environ.get("RAY_ADDRESS"):
        return None
    if device_type == "cuda":
        import torch

        n = min(cfg.parallel.tp, torch.cuda.device_count())
        props = [torch.cuda.get_device_properties(i) for i in range(n)]
        if not props:
            return None  # no GPU here: cli.py refuses runtime.device=cuda itself
        i = min(range(n), key=lambda k: props[k].total_memory)
        return Budget(props[i].total_memory, f"GPU {i} ({props[i].name}) has {size(props[i].total_memory)}", 1)
    avail = host_available_bytes()
    ranks = cfg.parallel.tp if cfg.parallel.launcher in ("local", "ray") else 1
    shared = f", shared by the {ranks} ranks of parallel.tp={cfg.parallel.tp}" if ranks > 1 else ""
    return Budget(avail, f"this host has {size(avail)} available{shared}", ranks)


def host_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else all physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def refusal(cfg: RunConfig, parts: dict[str, int], budget: Budget, what: str = "each rank",
            keys: dict[str, str] | None = None) -> str | None:
    """The error line when budget.ranks_here holders of `parts` bytes each do not fit the budget, else None.
    `keys`: per part, the keys that set it and what lowers it (default: a run's, PART_KEYS and ADVICE)."""
    need = sum(parts.values())
    if need * budget.ranks_here <= budget.bytes:
        return None
    r, top = cfg.runtime, max(parts, key=parts.get)
    where = " and ".join(dict.fromkeys(cfg.origin(k) for k in PART_KEYS[top]))
    detail = ", ".join(f"{k} {size(v)}" for k, v in parts.items())
    advice = (keys or {}).get(top) or f"the {top} are set by {', '.join(PART_KEYS[top])}: {ADVICE[top]}"
    return (f"{where}: {what} needs {size(need)} ({detail}; runtime.max_seqs={r.max_seqs}, runtime.max_len="
            f"{r.max_len}, {len(cfg.model.layer_ids())} layers, parallel.tp={cfg.parallel.tp}), but {budget.what}; "
            f"{advice}")


def check_memory(cfg: RunConfig) -> None:
    """Refuse a run whose ranks cannot hold their weights, caches and workspace on this machine's devices."""
    kind = device_type(cfg)
    budget = device_budget(cfg, kind)
    if budget is not None and (msg := refusal(cfg, rank_memory(cfg, kind), budget)):
        raise ConfigError(msg)
