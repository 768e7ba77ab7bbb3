"""DSV4Attention: one DeepSeek-V4 attention layer holding Hl = H / tp heads of this rank.

    forward = stage A (input GEMMs, RMSNorms; no metadata)
            -> stage B behind an eager break (positions, caches, compressor, indexer, sparse attention)
            -> stage C (grouped wo_a, row-parallel wo_b, the layer's single all-reduce)

Every kernel comes from the stack's one kernel backend (ops/select.py: torch or Triton, same methods);
`stage_b` is the layer's decode schedule: which kernels, on which stream, in what order. Where stage B runs
whole (a full graph; the wide and hoisted breaks, eagerly) its compressor and indexer branch may run on a
side stream beside the query branch (model/streams.py, runtime.streams). The narrow scope cuts stage B at
its break (`prepare`, `attend`, `commit`) and keeps one stream: its indexer branch would straddle a
captured segment and the break. The math, op by op: README "What one layer computes".

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
from tp_runtime.model.layers import ColumnParallelLinear, ReplicatedLinear, RMSNorm, RowParallelLinear
from tp_runtime.model.streams import INLINE, Inline, SideStream
from tp_runtime.ops.act_quant import RoundedX
from tp_runtime.ops.linear import grouped_linear
from tp_runtime.ops.select import KernelBackend
from tp_runtime.ops.torch_path import write_ring
from tp_runtime.parallel.group import TPGroup


class StageA(NamedTuple):
    """Metadata-independent products of x [T, hidden]; None where the layer kind has no such part."""

    qr: torch.Tensor  # [T, Rq] after q_norm, or before it where qr_norm is set
    kv: torch.Tensor  # [T, D] after kv_norm
    comp_kv: torch.Tensor | None  # [T, c*D] (r > 0): the compressor's projections of x, in the GEMM's dtype
    comp_score: torch.Tensor | None
    idx_w: torch.Tensor | None  # [T, Ih] (r = 4)
    idx_kv: torch.Tensor | None  # [T, 2*Id] (r = 4)
    idx_score: torch.Tensor | None
    qr_norm: RMSNorm | None = None  # q_norm, still to apply: each GEMM of qr takes it as its prologue
    qr_rounded: RoundedX | None = None  # qr rounded to e4m3 by q_norm's launch, for its FP8 GEMMs
    side_x: torch.Tensor | None = None  # x [T, hidden] where the GEMMs of comp_* and idx_* (None until then) run in
    #                                     `compress`, on the side branch (DSV4Attention.side_gemms)


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
MAIN_X = ("wq_a", "wkv")  # the projections of x the main branch reads (qr, kv); the rest feed the compressors
AUX_X = {"comp_kv": "compressor.wkv", "comp_score": "compressor.wgate", "idx_w": "indexer.weights_proj",
         "idx_kv": "indexer.compressor.wkv", "idx_score": "indexer.compressor.wgate"}  # StageA field -> projection


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
                 backend: KernelBackend, fp8: bool = False, side: SideStream | None = None):
        """backend: the stack's kernels (ops/select.py), shared by every layer; side: the stack's side stream
        (None: one stream), used by layers with a compressor (a window-only layer has no second branch)."""
        super().__init__()
        H, D, G = cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
        self.ratio, self.D, self.W = ratio, D, cfg.sliding_window
        self.n_local_heads = H // tp.size
        self.n_local_groups = G // tp.size
        self.eps, self.scale = cfg.rms_norm_eps, D ** -0.5
        self.rope_kind = "compressed" if ratio else "window"  # which rotary angles of the StepIndex
        self.backend = backend
        self.side: SideStream | Inline = side if side is not None and ratio else INLINE
        # Every projection of x in one replicated GEMM (two with FP8 weights: x_gemms): (module, its projections)
        self.x_gemms = [(name, rows) for name, _, rows in x_gemms(cfg, ratio, fp8)]
        for name, is_fp8, rows in x_gemms(cfg, ratio, fp8):
            self.add_module(name, ReplicatedLinear(cfg.hidden_size, sum(w for _, w in rows), dtype, device, backend,
                                                   is_fp8))
        self.q_norm = RMSNorm(cfg.q_lora_rank, self.eps, dtype, device, backend)
        self.kv_norm = RMSNorm(D, self.eps, dtype, device, backend)
        self.wq_b = ColumnParallelLinear(cfg.q_lora_rank, H * D, tp, dtype, device, backend, fp8)  # by heads
        self.attn_sink = nn.Parameter(torch.empty(self.n_local_heads, dtype=torch.float32, device=device),
                                      requires_grad=False)
        self.wo_a = ColumnParallelLinear(H * D // G, G * cfg.o_lora_rank, tp, dtype, device, backend, fp8)  # groups
        self.wo_b = RowParallelLinear(G * cfg.o_lora_rank, cfg.hidden_size, tp, dtype, device, backend, fp8)
        self.compressor = Compressor(ratio, D, self.eps, dtype, device, backend) if ratio else None
        self.indexer = Indexer(cfg, dtype, device, backend, fp8) if ratio == 4 else None

    # ------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, live: LiveBatch, cache: LayerCache, out: torch.Tensor,
                break_scope: str | None, x_rounded: RoundedX | None = None) -> torch.Tensor:
        """x [T, hidden] (normed) -> y [T, hidden], all-reduced. out [T, Hl*D] is the break's buffer; x_rounded:
        x rounded to e4m3 by the launch that normed it (`rounded_input_shapes`)."""
        if break_scope is None:  # no break: one graph holds the whole layer
            self.stage_b(self.stage_a(x, x_rounded), live, cache, out)
        elif break_scope == "wide":
            attention_wide(self, x, x_rounded, live, cache, out)
        elif break_scope == "hoisted":
            attention_hoisted(self, self.stage_a(x, x_rounded), live, cache, out)
        else:  # narrow: only top-K selection and the sparse attention stay in the break
            p = self.prepare(self.stage_a(x, x_rounded), live.batch, cache)
            attention_narrow(self, p, live, cache, out)
            self.commit(p, live.batch, cache)
        return self.stage_c(out)

    def rounded_input_shapes(self) -> list[tuple[int, int]]:
        """[N, K] of the GEMMs of x that take it rounded to e4m3 (FP8 weights, round_x): what a rounding of x
        made by x's producer can spare."""
        gemms = [getattr(self, name) for name, _ in self.x_gemms]
        return [tuple(m.qweight.shape) for m in gemms if m.fp8 and m.round_x]

    def side_gemms(self, t: int) -> list[str]:
        """The GEMMs of x run on the side branch (in `compress`) at t rows: those none of whose projections the main
        branch reads (with FP8 weights, the one of the projections the checkpoint holds in bf16, which only the
        compressors and the indexer read), where the backend runs them without state shared across streams. There
        they overlap the main branch's GEMMs of qr, whose launches leave bandwidth unused at decode sizes. t is the
        capture size or the eager batch: a shape, not a step's value."""
        mods = {name: getattr(self, name) for name, _ in self.x_gemms}
        return [name for name, rows in self.x_gemms if not {n for n, _ in rows} & set(MAIN_X)
                and not mods[name].fp8 and self.backend.linear_stream_safe(t, *mods[name].weight.shape)]

    def project(self, x: torch.Tensor, gemms: list[str], x_rounded: RoundedX | None = None) -> dict[str, torch.Tensor]:
        """x [T, hidden] through the GEMMs named -> {projection: a view [T, rows] of its GEMM's output}."""
        y = {}
        for name, rows in self.x_gemms:
            if name in gemms:
                y.update(zip([n for n, _ in rows], getattr(self, name)(x, rounded=x_rounded).split(
                    [w for _, w in rows], dim=-1)))
        return y

    def stage_a(self, x: torch.Tensor, x_rounded: RoundedX | None = None) -> StageA:
        """x [T, hidden] -> StageA; x_rounded: x's e4m3 rounding, for the FP8 GEMM of x."""
        side = self.side_gemms(len(x))
        y = self.project(x, [name for name, _ in self.x_gemms if name not in side], x_rounded)
        aux = {f: y.get(n) for f, n in AUX_X.items()}  # (None where on the side branch or not in this layer kind)
        kw = {"side_x": x if side else None}
        if self._q_norm_in_prologue(len(x)):  # wq_b and the indexer's wq_b each norm qr as they read it
            return StageA(y["wq_a"], self.kv_norm(y["wkv"]), **aux, qr_norm=self.q_norm, **kw)
        fp8_shapes = [m.qweight.shape for m in self._qr_readers() if m.fp8 and m.round_x]
        if fp8_shapes and self.backend.rounds_x_ahead(y["wq_a"], fp8_shapes):  # q_norm rounds qr for them
            qr, kv, qr_r = self.backend.rms_norm_pair_rounded(y["wq_a"], self.q_norm.weight, y["wkv"],
                                                              self.kv_norm.weight, self.eps)
            return StageA(qr, kv, **aux, qr_rounded=qr_r, **kw)
        qr, kv = self.backend.rms_norm_pair(y["wq_a"], self.q_norm.weight, y["wkv"], self.kv_norm.weight, self.eps)
        return StageA(qr, kv, **aux, **kw)

    def _qr_readers(self) -> list[nn.Module]:
        """The GEMMs that read qr: wq_b, and the indexer's wq_b at r = 4."""
        return [self.wq_b] + ([self.indexer.wq_b] if self.indexer is not None else [])

    def _q_norm_in_prologue(self, t: int) -> bool:
        """Whether every GEMM reading qr (wq_b; the indexer's wq_b at r = 4) takes q_norm as its prologue at t
        rows (bf16 weights, at the shapes where the backend's fused GEMV was measured faster): then the normed
        qr is never written. t is the capture size or the eager batch: a shape, not a step's value."""
        readers = self._qr_readers()
        return not any(m.fp8 for m in readers) and self.backend.norm_prologue(t, [m.weight.shape for m in readers])

    def stage_b(self, a: StageA, live: LiveBatch, cache: LayerCache, out: torch.Tensor) -> None:
        """Stage B of one step, the layer's schedule top to bottom; writes the attention output into out.
        T tokens (n real: a host int), Hl heads of D dims, Ih indexer heads of Id dims, K picks.

          main stream                                   side stream (self.side)
          fork --------------------------------------->   the GEMMs of x left to it (a.side_x: FP8 weights)
                                                           compressor: entries -> cache.compressed        r > 0
                                                           indexer compressor: keys -> cache.index_keys  r = 4
          wq_b: qr [T, Rq] -> q [T, Hl, D]                (q_norm as its prologue where a.qr_norm is set)
          indexer wq_b: qr -> idx_q [T, Ih, Id]   r = 4
          fork --------------------------------------->   rotary of idx_q                               r = 4
          heads, one launch: q per-head normed + roped,    indexer scores + top-K -> picks [n, K]        r = 4
            kv [T, D] roped into the window's dtype
            (b.decode: and stored into the window ring)
          join <---------------------------------------
          sparse attention with sink over each token's W window and C compressed rows, inverse rotary
            -> out [n, Hl*D] (padding rows zero)
          window ring write of kv, unless b.decode (after attention: a chunk's gathers read the ring's
            older rows, which its later tokens' stores would overwrite)

        The weight GEMMs stay on the main stream but the side branch's GEMMs of x (`side_gemms`): at decode sizes
        one GEMM at a time leaves bandwidth unused, but the Triton GEMMs of one device share their split-K
        counters (ops/linear.py), so only GEMMs the backend runs without them go to the side. With one
        stream (self.side is Inline: CPU, runtime.streams=1, window-only layers) the side work runs in place
        in this order, and the heads launch also ropes idx_q: the same values, one launch fewer.
        """
        b, side = live.batch, self.side
        cis = b.ix.cis[self.rope_kind]  # [T, Dr/2] at each token's position
        side.fork()
        with side.branch():
            idx_w = self.compress(a, b, cache)
        q = self.query(a.qr, a.qr_norm, a.qr_rounded)
        idx_q = self.indexer.query(a.qr, a.qr_norm, a.qr_rounded) if self.indexer is not None else None
        side.fork()
        ring = (cache.window, b.ix.rings[self.W]) if b.decode else None
        q, kv, fused_idx_q = self.backend.heads(q, a.kv, cis, self.eps, cache.window.dtype,
                                                None if side.overlaps else idx_q, ring)
        with side.branch():
            picks = None
            if self.indexer is not None:
                idx_q = self.backend.rotary(idx_q, cis) if side.overlaps else fused_idx_q
                picks = self.indexer.select(idx_q, idx_w, b, cache)
        side.join()
        self.attention(q, kv, picks, b, cache, out)
        if not b.decode:
            write_ring(cache.window, kv, b.ix.rings[self.W])

    # ------------------------------------------------------------ stage B cut at the narrow break

    def prepare(self, a: StageA, b: StepBatch, cache: LayerCache) -> Prepared:
        """stage_b up to the top-K, on one stream, for all T tokens: reads only device metadata, so the
        narrow scope captures it. Emits compressed entries and indexer keys into the caches."""
        q = self.query(a.qr, a.qr_norm, a.qr_rounded)
        idx_q = self.indexer.query(a.qr, a.qr_norm, a.qr_rounded) if self.indexer is not None else None
        q, kv, idx_q = self.backend.heads(q, a.kv, b.ix.cis[self.rope_kind], self.eps, cache.window.dtype, idx_q)
        idx_w = self.compress(a, b, cache)
        return Prepared(q, kv, idx_q, idx_w)

    def attend(self, p: Prepared, live: LiveBatch, cache: LayerCache, out: torch.Tensor) -> None:
        """The narrow scope's break: top-K and the sparse attention, sized by host metadata."""
        b = live.batch
        picks = self.indexer.select(p.idx_q, p.idx_w, b, cache) if self.indexer is not None else None
        self.attention(p.q, p.kv, picks, b, cache, out)

    def commit(self, p: Prepared, b: StepBatch, cache: LayerCache) -> None:
        """The window ring write, after attention. p.kv is already in the ring's dtype: one indexed store."""
        write_ring(cache.window, p.kv, b.ix.rings[self.W])

    # ------------------------------------------------------------ the parts of stage B

    def query(self, qr: torch.Tensor, qr_norm: RMSNorm | None = None, rounded: RoundedX | None = None
              ) -> torch.Tensor:
        """wq_b: qr [T, Rq] (through qr_norm first, if given; rounded: qr's e4m3 rounding, made ahead) -> q [T, Hl,
        D], unroped (a fresh buffer, which the Triton backend ropes in place)."""
        return self.wq_b(qr, qr_norm, rounded).view(len(qr), self.n_local_heads, self.D)

    def compress(self, a: StageA, b: StepBatch, cache: LayerCache) -> torch.Tensor | None:
        """The compressors: this step's completed entries into cache.compressed (r > 0) and indexer keys
        into cache.index_keys (r = 4; FP8 caches: their scales into cache.index_scales); device metadata only.
        First the GEMMs of x left to the side branch (a.side_x). Returns the indexer's head weights idx_w (r = 4)."""
        if a.side_x is not None:
            y = self.project(a.side_x, self.side_gemms(len(a.side_x)))
            a = a._replace(**{f: y[n] for f, n in AUX_X.items() if n in y})
        if self.compressor is not None:
            self.compressor(a.comp_kv, a.comp_score, b, cache.comp_state, cache.compressed)
        if self.indexer is not None:
            self.indexer.prepare(a.idx_kv, a.idx_score, b, cache)
        return a.idx_w

    def attention(self, q: torch.Tensor, kv: torch.Tensor, picks: torch.Tensor | None, b: StepBatch,
                  cache: LayerCache, out: torch.Tensor) -> None:
        """Sparse attention with sink of the n real tokens over their window rows (the ring's and this
        step's kv) and compressed rows (r = 4: picks [n, K]; r = 128: every completed entry), inverse
        rotary; o [n, Hl*D] into out, padding rows zero."""
        n = b.n_tokens
        n_done = b.ix.blocks[self.ratio].n_done[:n] if self.ratio else None
        self.backend.sparse_attention(q[:n], kv, cache.window, b.ix.rings[self.W].tokens(0, n), cache.compressed,
                                      b.slot[:n], picks, n_done, self._n_compressed(b, picks), self.attn_sink,
                                      self.scale, b.ix.cis[self.rope_kind][:n], out[:n])
        out[n:].zero_()

    def _n_compressed(self, b: StepBatch, picks: torch.Tensor | None) -> int:
        """C, the host bound on a token's compressed candidates: K picks (ratio 4), every entry a
        position up to max_pos completes (ratio 128), none (window-only)."""
        if picks is not None:
            return picks.shape[1]
        return (b.max_pos + 1) // self.ratio if self.ratio else 0

    # ------------------------------------------------------------ stage C

    def stage_c(self, o: torch.Tensor) -> torch.Tensor:
        """o [T, Hl*D] -> per-group wo_a [T, Gl*Ro] -> row-parallel wo_b, all-reduced -> [T, hidden]."""
        return self.wo_b(self._wo_a(o))

    def _wo_a(self, o: torch.Tensor) -> torch.Tensor:
        """One grouped GEMM, o [T, Hl*D] -> [T, Gl*Ro]: group g's rows [g*Ro, (g+1)*Ro) of wo_a read o's
        columns of group g (FP8 as stored, o rounded to e4m3 first where the stack rounds every FP8 GEMM's input;
        or one strided batched GEMM: no copies of o's groups)."""
        if self.wo_a.fp8:
            return self.backend.fp8_linear(o, self.wo_a.qweight, self.wo_a.scale, groups=self.n_local_groups,
                                           round_x=self.wo_a.round_x)
        return grouped_linear(o, self.wo_a.weight, self.n_local_groups)


@eager_break_during_capture
def attention_wide(layer: DSV4Attention, x: torch.Tensor, x_rounded: RoundedX | None, live: LiveBatch,
                   cache: LayerCache, out: torch.Tensor) -> None:
    """Eager region of the wide scope: stages A and B."""
    layer.stage_b(layer.stage_a(x, x_rounded), live, cache, out)


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
