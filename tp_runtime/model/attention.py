"""DSV4Attention: one DeepSeek-V4 attention layer holding Hl = H / tp heads of this rank.

    forward = stage A (input GEMMs, RMSNorms; no metadata)
            -> stage B behind an eager break (positions, caches, compressor, indexer, sparse attention)
            -> stage C (grouped wo_a, row-parallel wo_b, the layer's single all-reduce)

`break_scope` places the break: "wide" breaks around stages A and B (DSV4 before vLLM PR 44561);
"hoisted" captures stage A and breaks around stage B (that change); "narrow" also captures what
needs only device metadata (wq_b, q/kv rotary, compressors, indexer query, window ring write) and
breaks only around top-K selection and the sparse attention; None has no break (a full graph).
Outside CUDA-graph capture the break is a plain call, so the same code is the eager path.

Stage B takes its sizes from the batch's host ints (n_tokens, max_pos). A full graph runs it on a
static batch (`StepBuffers.view` with n_tokens = every row and max_pos = runtime.max_len - 1): every
candidate set then has the size the caches allow (W window rows; K picks of up to max_len / 4 indexer
keys; every one of max_len / 128 compressed rows), masked on the device by each token's live counts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from tp_runtime.config import ModelConfig
from tp_runtime.graphs import eager_break_during_capture
from tp_runtime.model.batch import LiveBatch, StepBatch
from tp_runtime.model.cache import LayerCache
from tp_runtime.model.compressor import Compressor
from tp_runtime.model.indexer import Indexer
from tp_runtime.model.layers import ColumnParallelLinear, ReplicatedLinear, RMSNorm, RowParallelLinear, rms_norm
from tp_runtime.model.rope import apply_rotary
from tp_runtime.model.step_index import RingIndex
from tp_runtime.ops.cache_fp8 import dequantize_rows, quantize_rows, row_bytes
from tp_runtime.ops.linear import fp8_linear, grouped_linear
from tp_runtime.ops.rope import prepare_heads
from tp_runtime.ops.sparse_attention import sparse_attention_sink
from tp_runtime.ops.torch_path import gather_rows, sparse_attention, token_chunks, write_ring
from tp_runtime.parallel.group import TPGroup


class StageA(NamedTuple):
    """Metadata-independent products of x [T, hidden]; None where the layer kind has no such part."""

    qr: torch.Tensor  # [T, Rq] after q_norm
    kv: torch.Tensor  # [T, D] after kv_norm
    comp_kv: torch.Tensor | None  # [T, c*D] (r > 0): the compressor's projections of x, in the GEMM's dtype
    comp_score: torch.Tensor | None
    idx_w: torch.Tensor | None  # [T, Ih] (r = 4)
    idx_kv: torch.Tensor | None  # [T, 2*Id] (r = 4)
    idx_score: torch.Tensor | None


class Prepared(NamedTuple):
    """Stage-B products that need only device metadata (capturable in the narrow scope)."""

    q: torch.Tensor  # [T, Hl, D] per-head normed, roped
    kv: torch.Tensor  # [T, D] roped, cache dtype: this step's window rows (FP8 caches: uint8 [T, row bytes])
    idx_q: torch.Tensor | None  # [T, Ih, Id] roped indexer query (r = 4)
    idx_w: torch.Tensor | None  # [T, Ih] indexer head weights (r = 4)


def x_projections(cfg: ModelConfig, ratio: int) -> list[tuple[str, int]]:
    """Every projection of a layer's normed input x, in the row order of its one fused GEMM `wx`:
    (checkpoint module under layers.{i}.attn., output rows). One GEMM reads x once, instead of two
    (window-only), four (r = 128) or seven (r = 4) launches of small matrices."""
    D, c = cfg.head_dim, 2 if ratio == 4 else 1
    rows = [("wq_a", cfg.q_lora_rank), ("wkv", D)]
    if ratio:
        rows += [("compressor.wkv", c * D), ("compressor.wgate", c * D)]
    if ratio == 4:
        Ih, Id = cfg.index_n_heads, cfg.index_head_dim
        rows += [("indexer.weights_proj", Ih), ("indexer.compressor.wkv", 2 * Id),
                 ("indexer.compressor.wgate", 2 * Id)]
    return rows


FP8_X = ("wq_a", "wkv")  # the projections of x released in FP8


def x_gemms(cfg: ModelConfig, ratio: int, fp8: bool) -> list[tuple[str, bool, list[tuple[str, int]]]]:
    """The GEMMs that compute x_projections: (module, holds FP8, its projections in row order). One GEMM
    in bf16; with FP8 weights, wq_a + wkv as stored (FP8) and the bf16 rest, each its own GEMM."""
    rows = x_projections(cfg, ratio)
    if not fp8:
        return [("wx", False, rows)]
    rest = [r for r in rows if r[0] not in FP8_X]
    return [("wx_fp8", True, [r for r in rows if r[0] in FP8_X])] + ([("wx", False, rest)] if rest else [])


class DSV4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int, tp: TPGroup, dtype: torch.dtype, device: torch.device,
                 kernels: str = "torch", fp8: bool = False):
        super().__init__()
        H, D, G = cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
        self.ratio, self.D, self.W = ratio, D, cfg.sliding_window
        self.n_local_heads = H // tp.size
        self.n_local_groups = G // tp.size
        self.eps, self.scale = cfg.rms_norm_eps, D ** -0.5
        self.rope_kind = "compressed" if ratio else "window"  # which rotary angles of the StepIndex
        # Every projection of x in one replicated GEMM (two with FP8 weights: x_gemms).
        self.x_gemms = [(name, [w for _, w in rows]) for name, _, rows in x_gemms(cfg, ratio, fp8)]
        self.x_names = [n for _, _, rows in x_gemms(cfg, ratio, fp8) for n, _ in rows]
        for name, is_fp8, rows in x_gemms(cfg, ratio, fp8):
            self.add_module(name, ReplicatedLinear(cfg.hidden_size, sum(w for _, w in rows), dtype, device, is_fp8))
        self.q_norm = RMSNorm(cfg.q_lora_rank, self.eps, dtype, device, kernels)
        self.kv_norm = RMSNorm(D, self.eps, dtype, device, kernels)
        self.wq_b = ColumnParallelLinear(cfg.q_lora_rank, H * D, tp, dtype, device, fp8)  # by heads
        self.attn_sink = nn.Parameter(torch.empty(self.n_local_heads, dtype=torch.float32, device=device),
                                      requires_grad=False)
        self.wo_a = ColumnParallelLinear(H * D // G, G * cfg.o_lora_rank, tp, dtype, device, fp8)  # by groups
        self.wo_b = RowParallelLinear(G * cfg.o_lora_rank, cfg.hidden_size, tp, dtype, device, fp8)
        self.compressor = Compressor(ratio, D, self.eps, dtype, device, kernels) if ratio else None
        self.indexer = Indexer(cfg, dtype, device, kernels, fp8) if ratio == 4 else None
        # Steps 9-11 (ops/select.py): the torch composition or the fused kernel; same signature and meaning.
        self._sparse_attention = sparse_attention_sink if kernels == "triton" else sparse_attention_torch
        # q norm + rotary, kv and indexer-query rotary: the torch composition or one launch (ops/rope.py).
        self._heads = heads_triton if kernels == "triton" else heads_torch

    # ------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, live: LiveBatch, cache: LayerCache, out: torch.Tensor,
                break_scope: str | None) -> torch.Tensor:
        """x [T, hidden] (normed) -> y [T, hidden], all-reduced. out [T, Hl*D] is the break's buffer."""
        if break_scope is None:  # no break: one graph holds the whole layer
            self.stage_b(self.stage_a(x), live, cache, out)
        elif break_scope == "wide":
            attention_wide(self, x, live, cache, out)
        elif break_scope == "hoisted":
            attention_hoisted(self, self.stage_a(x), live, cache, out)
        else:  # narrow: only top-K selection and the sparse attention stay in the break
            p = self.prepare(self.stage_a(x), live.batch, cache)
            attention_narrow(self, p, live, cache, out)
            self.commit(p, live.batch, cache)
        return self.stage_c(out)

    def stage_a(self, x: torch.Tensor) -> StageA:
        parts = [p for name, widths in self.x_gemms for p in getattr(self, name)(x).split(widths, dim=-1)]
        y = dict(zip(self.x_names, parts))  # views of each GEMM's [T, rows] output
        comp = (y["compressor.wkv"], y["compressor.wgate"]) if self.compressor else (None, None)
        idx = ((y["indexer.weights_proj"], y["indexer.compressor.wkv"], y["indexer.compressor.wgate"])
               if self.indexer else (None, None, None))
        return StageA(self.q_norm(y["wq_a"]), self.kv_norm(y["wkv"]), *comp, *idx)

    def stage_b(self, a: StageA, live: LiveBatch, cache: LayerCache, out: torch.Tensor) -> None:
        """Steps 4-11 for the current step; writes the attention output into out."""
        p = self.prepare(a, live.batch, cache)
        self.attend(p, live, cache, out)
        self.commit(p, live.batch, cache)

    def prepare(self, a: StageA, b: StepBatch, cache: LayerCache) -> Prepared:
        """Steps 4-8 up to the indexer query, on all T tokens: reads only device metadata, so a
        graph may capture it. Emits compressed entries and indexer keys into the caches."""
        q, kv, idx_q = self._heads(*self.head_projections(a.qr), a.kv, b.ix.cis[self.rope_kind], self.eps,
                                   cache.window.dtype)
        if self.compressor is not None:
            self.compressor(a.comp_kv, a.comp_score, b, cache.comp_state, cache.compressed)
        if self.indexer is not None:
            self.indexer.prepare(a.idx_kv, a.idx_score, b, cache)
        return Prepared(q, kv, idx_q, a.idx_w)

    def head_projections(self, qr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """qr [T, Rq] -> q [T, Hl, D] (wq_b) and the indexer query [T, Ih, Id] (ratio 4) or None, unroped:
        fresh buffers, which the triton path rotates in place."""
        q = self.wq_b(qr).view(len(qr), self.n_local_heads, self.D)
        return q, (self.indexer.query(qr) if self.indexer is not None else None)

    def attend(self, p: Prepared, live: LiveBatch, cache: LayerCache, out: torch.Tensor) -> None:
        """Steps 8-11 for the n real tokens: top-K, candidates, sparse attention with sink, inverse
        rotary; writes o [n, Hl*D] into out (padding rows zero). Sizes come from host metadata."""
        b = live.batch
        n = b.n_tokens
        picks = self.indexer.select(p.idx_q, p.idx_w, b, cache) if self.indexer is not None else None
        n_done = b.ix.blocks[self.ratio].n_done[:n] if self.ratio else None
        self._sparse_attention(p.q[:n], p.kv, cache.window, b.ix.rings[self.W].tokens(0, n), cache.compressed,
                               b.slot[:n], picks, n_done, self._n_compressed(b, picks), self.attn_sink,
                               self.scale, b.ix.cis[self.rope_kind][:n], out[:n])
        out[n:].zero_()

    def commit(self, p: Prepared, b: StepBatch, cache: LayerCache) -> None:
        """Step 6's ring write, after attention: the gathers read the ring's older rows. p.kv is
        already in the ring's dtype, so this is one indexed store, no cast copy."""
        write_ring(cache.window, p.kv, b.ix.rings[self.W])

    def stage_c(self, o: torch.Tensor) -> torch.Tensor:
        """o [T, Hl*D] -> per-group wo_a [T, Gl*Ro] -> row-parallel wo_b, all-reduced -> [T, hidden]."""
        return self.wo_b(self._wo_a(o))

    def _wo_a(self, o: torch.Tensor) -> torch.Tensor:
        """One grouped GEMM, o [T, Hl*D] -> [T, Gl*Ro]: group g's rows [g*Ro, (g+1)*Ro) of wo_a read o's
        columns of group g (FP8 as stored, or one strided batched GEMM: no copies of o's groups)."""
        if self.wo_a.fp8:
            return fp8_linear(o, self.wo_a.qweight, self.wo_a.scale, groups=self.n_local_groups)
        return grouped_linear(o, self.wo_a.weight, self.n_local_groups)

    def _n_compressed(self, b: StepBatch, picks: torch.Tensor | None) -> int:
        """C, the host bound on a token's compressed candidates: K picks (ratio 4), every entry a
        position up to max_pos completes (ratio 128), none (window-only)."""
        if picks is not None:
            return picks.shape[1]
        return (b.max_pos + 1) // self.ratio if self.ratio else 0


# ---------------------------------------------------------------- query and key heads of stage B


def heads_torch(q: torch.Tensor, idx_q: torch.Tensor | None, kv: torch.Tensor, cis: torch.Tensor, eps: float,
                kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Steps 4-5 and the indexer query on the torch path: q [T, Hl, D] per-head normed and roped; kv [T, D]
    (after kv_norm) roped in kv_dtype (the window cache's; uint8: FP8 rows [T, row bytes] quantized from the
    roped row in kv's dtype, so this step's readers see exactly what the ring will hold); idx_q [T, Ih, Id]
    (ratio 4) or None roped. cis [T, Dr/2] at each token's position (for ratio 4 cis["compressed"], which the
    indexer uses too)."""
    kv = apply_rotary(kv, cis)
    kv = quantize_rows(kv, 2 * cis.shape[-1]) if kv_dtype == torch.uint8 else kv.to(kv_dtype)
    return apply_rotary(rms_norm(q, None, eps), cis), kv, apply_rotary(idx_q, cis) if idx_q is not None else None


def heads_triton(q: torch.Tensor, idx_q: torch.Tensor | None, kv: torch.Tensor, cis: torch.Tensor, eps: float,
                 kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """heads_torch's results in one launch: q and idx_q rotated in place, kv into a new buffer of kv_dtype
    (uint8: FP8 rows, quantized in the kernel)."""
    T, D = kv.shape
    width = row_bytes(D, 2 * cis.shape[-1]) if kv_dtype == torch.uint8 else D
    kv_out = torch.empty(T, width, dtype=kv_dtype, device=kv.device)
    prepare_heads(q, kv, kv_out, cis, eps, idx_q)
    return q, kv_out, idx_q


# ---------------------------------------------------------------- the attention of stage B, torch path


def sparse_attention_torch(q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, ring: RingIndex,
                           compressed: torch.Tensor | None, slot: torch.Tensor, picks: torch.Tensor | None,
                           n_done: torch.Tensor | None, n_comp: int, sink: torch.Tensor, scale: float,
                           cis: torch.Tensor, out: torch.Tensor) -> None:
    """Steps 9-11 for T tokens on the torch path: gather each token's candidates (its W window rows,
    oldest first, then its compressed rows), sparse attention with sink, inverse rotary; o into out [T, Hl*D].

    q [T, Hl, D]; kv [T, D] this step's rows (the ring must not yet hold them); window [slots, W, D]
    (with FP8 caches kv, window and compressed hold uint8 rows of row bytes, dequantized once gathered);
    ring: the RingIndex of W rows for these T tokens; compressed [slots, N, D] or None (window-only);
    slot [T]; picks [T, C] (ratio 4: the indexer's picks, -1 = none) or None (ratio 128: every entry
    < n_done[t] of the first n_comp); n_done [T]; n_comp: C; sink [Hl] fp32; cis [T, Dr/2] at pos.
    `ops.sparse_attention.sparse_attention_sink` computes the same without gathering.
    """
    T, _, D = q.shape
    W = window.shape[1]
    o = torch.empty_like(q)
    for s, e in token_chunks(T, (W + n_comp) * D):
        ix = ring.tokens(s, e)
        rows, valid = gather_rows(kv, window, ix), ix.valid  # [t, W], oldest first
        if compressed is not None:
            if picks is not None:  # CSA: the indexer's top-K
                idx, ok = picks[s:e].clamp(min=0), picks[s:e] >= 0
            else:  # HCA: every completed entry
                idx = torch.arange(n_comp, device=q.device)[None].expand(e - s, -1)
                ok = idx < n_done[s:e, None]
            crow = compressed[slot[s:e, None], idx]
            rows, valid = torch.cat((rows, crow), dim=1), torch.cat((valid, ok), dim=1)
        if rows.dtype == torch.uint8:  # FP8 rows -> the run dtype (exact)
            rows = dequantize_rows(rows, D, 2 * cis.shape[-1], q.dtype)
        o[s:e] = sparse_attention(q[s:e], rows, valid, sink, scale).to(o.dtype)
    out.copy_(apply_rotary(o, cis, inverse=True).flatten(1))


@eager_break_during_capture
def attention_wide(layer: DSV4Attention, x: torch.Tensor, live: LiveBatch, cache: LayerCache,
                   out: torch.Tensor) -> None:
    """Eager region of the wide scope: stages A and B."""
    layer.stage_b(layer.stage_a(x), live, cache, out)


@eager_break_during_capture
def attention_hoisted(layer: DSV4Attention, a: StageA, live: LiveBatch, cache: LayerCache,
                      out: torch.Tensor) -> None:
    """Eager region of the hoisted scope: stage B only (stage A stays in the captured segment)."""
    layer.stage_b(a, live, cache, out)


@eager_break_during_capture
def attention_narrow(layer: DSV4Attention, p: Prepared, live: LiveBatch, cache: LayerCache,
                     out: torch.Tensor) -> None:
    """Eager region of the narrow scope: indexer top-K and sparse attention (sizes from host metadata)."""
    layer.attend(p, live, cache, out)
