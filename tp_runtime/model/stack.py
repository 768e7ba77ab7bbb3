"""AttentionStack: the selected DSV4 attention layers with their pre-norms and residuals.

    h = h + Attention_i(RMSNorm(h, attn_norm_i))   for each selected layer i

A layer's residual add and the next layer's attn_norm run as one backend call (add_rms_norm: one launch on
the Triton backend), with the same rounding as the two apart.

MoE, hyper-connections, embeddings and the LM head are outside this project's scope. Parameter
names follow the checkpoint: `layers.{i}.attn_norm.weight`, `layers.{i}.attn.*`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from tp_runtime.config import ModelConfig
from tp_runtime.model.attention import DSV4Attention
from tp_runtime.model.batch import LiveBatch
from tp_runtime.model.cache import LayerCache, allocate_layer_cache
from tp_runtime.model.indexer import Indexer
from tp_runtime.model.layers import Linear, RMSNorm
from tp_runtime.model.step_index import IndexPlan
from tp_runtime.model.streams import SideStream
from tp_runtime.ops.select import KernelBackend
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.parallel.group import TPGroup

LAYER_RANGE = "layer {layer} ratio {ratio}"  # a layer's profiler range (bench/profile.py counts kernels in it)
STREAMS = (1, 2)  # runtime.streams: stage B on one stream, or with its compressor and indexer branch on a second


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int, tp: TPGroup, dtype: torch.dtype, device: torch.device,
                 backend: KernelBackend, fp8: bool, side: SideStream | None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device, backend)
        self.attn = DSV4Attention(cfg, ratio, tp, dtype, device, backend, fp8, side)


class AttentionStack(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, max_len: int, dtype: torch.dtype, device: torch.device,
                 backend: KernelBackend | None = None, fp8: bool = False, fp8_cache: bool = False,
                 round_x: bool = False, streams: int = 1, indexer_q_fp8: bool = False):
        """backend: the kernels of every layer, chosen once (ops/select.py `select_backend`; default torch);
        fp8: the released FP8 matrices stay FP8 with their block scales (runtime.weight_format=fp8);
        round_x: FP8 GEMMs round x to e4m3 per 1 x 128 block (runtime.fp8_activations=e4m3, ops/fp8_gemm.py);
        fp8_cache: caches in the released FP8 layouts (runtime.cache_format=fp8; the layers follow the
        caches they are given); streams: 2 runs each compressed layer's compressor and indexer branch on a
        side stream, made here once and shared by the layers (CUDA only: elsewhere everything runs on one);
        indexer_q_fp8: the indexers score each head's query rounded to e4m3 (runtime.indexer_q=e4m3,
        ops/indexer_topk.py)."""
        super().__init__()
        assert streams in STREAMS, streams
        backend = backend if backend is not None else TorchBackend()
        self.cfg, self.tp, self.dtype, self.device = cfg, tp, dtype, device
        self.backend, self.fp8, self.fp8_cache = backend, fp8, fp8_cache
        self.side = SideStream(device) if streams == 2 and device.type == "cuda" else None
        self.layer_ids = cfg.layer_ids()
        self.ratios = [cfg.compress_ratios[i] for i in self.layer_ids]
        max_pos = max_len + 1  # positions 0..max_len-1 and compressed-entry positions i*r <= max_len
        # What the layers read per step (rings, blocks, rotary tables), built once per step by StepBuffers.
        self.index_plan = IndexPlan(cfg, self.ratios, max_pos, device, dtype)
        self.layers = nn.ModuleDict({
            str(i): Block(cfg, r, tp, dtype, device, backend, fp8, self.side)
            for i, r in zip(self.layer_ids, self.ratios)})
        for m in self.modules():
            if isinstance(m, Linear) and m.fp8:
                m.round_x = round_x
            if isinstance(m, Indexer):
                m.q_fp8 = indexer_q_fp8
        # True while a profiler view counts kernels per layer: each layer's launches (its attention, its
        # residual add and the next attn_norm) run inside a named range "layer I ratio R". Host-side only:
        # nothing on the GPU changes, and a captured graph holds the same kernels either way.
        self.annotate_layers = False

    @property
    def kernels(self) -> str:
        """The backend's name, as reports give it: torch | triton."""
        return self.backend.name

    @property
    def streams(self) -> int:
        """Streams stage B runs on: 2 with a side stream, else 1."""
        return 1 if self.side is None else 2

    def allocate_caches(self, slots: int, max_len: int) -> list[LayerCache]:
        return [allocate_layer_cache(self.cfg, r, slots, max_len, self.dtype, self.device, self.fp8_cache)
                for r in self.ratios]

    def attn_out_width(self) -> int:
        """Width of the eager break's output buffer: Hl * D."""
        return self.cfg.num_attention_heads // self.tp.size * self.cfg.head_dim

    def forward(self, h: torch.Tensor, live: LiveBatch, caches: list[LayerCache], out: torch.Tensor,
                break_scope: str | None) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]. out [>=T, Hl*D] is reused by every layer's eager break."""
        o = out[: h.shape[0]]
        blocks = list(self.layers.values())
        if not blocks:
            return h
        x, xr = blocks[0].attn_norm(h), None
        for i, (blk, cache) in enumerate(zip(blocks, caches)):
            with self._layer_range(i):
                y = blk.attn(x, live, cache, o, break_scope, xr)
                if i + 1 == len(blocks):
                    return h + y
                # The residual add and the next layer's attn_norm in one launch: h + y, RMSNorm(h + y); and
                # the normed x rounded to e4m3 by that launch where the next layer's FP8 GEMM of x would
                # otherwise round it by a launch of its own.
                nxt, shapes = blocks[i + 1].attn_norm, blocks[i + 1].attn.rounded_input_shapes()
                if shapes and self.backend.rounds_x_ahead(h, shapes):
                    h, x, xr = self.backend.add_rms_norm_rounded(h, y, nxt.weight, nxt.eps)
                else:
                    h, x, xr = *self.backend.add_rms_norm(h, y, nxt.weight, nxt.eps), None

    def _layer_range(self, i: int):
        """The profiler range of the i-th selected layer while `annotate_layers` is set (LAYER_RANGE format)."""
        if not self.annotate_layers:
            return nullcontext()
        return torch.profiler.record_function(LAYER_RANGE.format(layer=self.layer_ids[i], ratio=self.ratios[i]))
