"""ModelShard: one rank's model state. Its slice of the attention stack with weights, the caches,
the static step buffers and the eager break's output buffer.

A Worker replays steps on a shard. Workers that differ only in how a step runs (graph mode, break
scope) may share one: the bench compares modes on a single copy of weights and caches (at 43 Flash
layers and 32K contexts that copy is ~40 GB), the modes' lanes continuing the same sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.config import ConfigError, RunConfig, uses_fp8_cache, uses_fp8_weights
from tp_runtime.executor.buffers import StepBuffers
from tp_runtime.memory_model import buffer_capacity
from tp_runtime.model.batch import LiveBatch
from tp_runtime.model.cache import LayerCache
from tp_runtime.model.stack import AttentionStack
from tp_runtime.ops.kernel_support import resolve_pdl
from tp_runtime.ops.select import select_backend
from tp_runtime.parallel.group import TPGroup
from tp_runtime.weights.fill import fill_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]




@dataclass
class ModelShard:
    cfg: RunConfig
    tp: TPGroup
    dtype: torch.dtype
    stack: AttentionStack
    load_report: dict
    caches: list[LayerCache]
    buffers: StepBuffers
    attn_out: torch.Tensor  # [capacity, Hl*D]: every layer's eager break writes its output here
    live: LiveBatch  # the step being run, read by eager breaks when they run

    @classmethod
    def build(cls, cfg: RunConfig, tp: TPGroup, oneshot: bool = False) -> "ModelShard":
        """Build the stack shard, draw or load its weights, allocate caches and buffers."""
        rt, device = cfg.runtime, tp.device
        dtype = resolve_dtype(rt.dtype, device)
        # The one place the kernel backend is chosen; programmatic dependent launch joins it here, resolved.
        try:
            pdl = resolve_pdl(rt.pdl, device)
        except ValueError as e:
            raise ConfigError(f"{cfg.source}: {e}") from None
        backend = select_backend(rt.kernels, device, dtype, pdl=pdl)
        stack = AttentionStack(cfg.model, tp, rt.max_len, dtype, device, backend, fp8=uses_fp8_weights(cfg, device),
                               fp8_cache=uses_fp8_cache(cfg, device), round_x=rt.fp8_activations == "e4m3",
                               streams=rt.streams, indexer_q_fp8=rt.indexer_q == "e4m3")
        load_report = fill_weights(stack, cfg.model.checkpoint, rt.seed)
        # This rank's parameter bytes as held (FP8 values and scale bytes, or the run dtype): load_param_bytes.
        load_report.setdefault("param_bytes", sum(p.numel() * p.element_size() for p in stack.parameters()))
        capacity = buffer_capacity(cfg, oneshot)
        buffers = StepBuffers(capacity, cfg.model.hidden_size, dtype, device, trash_slot=rt.max_seqs,
                              plan=stack.index_plan, backend=backend)
        attn_out = torch.zeros(capacity, stack.attn_out_width(), dtype=dtype, device=device)
        return cls(cfg, tp, dtype, stack, load_report, stack.allocate_caches(rt.max_seqs, rt.max_len), buffers,
                   attn_out, LiveBatch())

    def check_serves(self, cfg: RunConfig, tp: TPGroup, oneshot: bool) -> None:
        """Refuse a Worker config this shard was not built for (other model, runtime, group or capacity)."""
        for section in ("model", "runtime"):
            if getattr(cfg, section) != getattr(self.cfg, section):
                raise ValueError(f"{cfg.source}: its {section} section differs from the shared shard's "
                                 f"({self.cfg.source}); only graph settings may differ")
        if (tp.size, tp.rank, tp.device) != (self.tp.size, self.tp.rank, self.tp.device):
            raise ValueError(f"{cfg.source}: rank {tp.rank} of {tp.size} on {tp.device} cannot use a shard built for "
                             f"rank {self.tp.rank} of {self.tp.size} on {self.tp.device}")
        if buffer_capacity(cfg, oneshot) > self.buffers.capacity:
            raise ValueError(f"{cfg.source}: needs {buffer_capacity(cfg, oneshot)} buffer rows, "
                             f"the shared shard has {self.buffers.capacity}")
