"""The torch twins of every stage-B kernel, in plain torch: the semantics, and the CPU path.

RMSNorm, GPT-J rotary, query / key head preparation, the gated-pooling compressor, row gathers from ring
caches, indexer top-K, sparse attention with sink, and the per-step index. They run on CPU and GPU alike
and define what any faster kernel must reproduce: the Triton kernels of tp_runtime/ops/ take the same
arguments and compute the same values (`ops/triton_path.py` binds them; `ops/select.py` picks one set per shard).
Work is split into token chunks so that gathered candidates stay within a fixed memory budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from tp_runtime.ops.act_quant import ROUNDED_ROWS, RoundedX, quantize_x_torch
from tp_runtime.ops.cache_fp8 import dequantize_keys, dequantize_rows, quantize_keys, quantize_rows, round_keys
from tp_runtime.ops.fp8_gemm import fp8_gemm_torch
from tp_runtime.ops.index import BlockIndex, RingIndex, RingState
from tp_runtime.ops.linear import fp8_linear_torch


# Elements (not bytes) one chunk of gathered candidates may occupy; bounds peak memory of long prefills.
CHUNK_ELEMENTS = 1 << 25


def token_chunks(n_tokens: int, per_token: int) -> list[tuple[int, int]]:
    """[start, end) token ranges whose gathered candidates stay under CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    return [(s, min(s + step, n_tokens)) for s in range(0, n_tokens, step)]


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in the precision the twins compute in: fp32, or float64 for a float64 run (whose check tolerance,
    1e-9, an fp32 step would exceed)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """y = w * x * rsqrt(mean(x^2) + eps) over the last dim, in fp32 (float64 for float64 x); returns x's dtype."""
    xf = wide(x)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    return y.to(x.dtype)


def apply_rotary(x: torch.Tensor, cis: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last Dr dims of x [T, ..., D] by cis [T, Dr/2] (complex, broadcast over head dims;
    by the conjugate when inverse). Pair (x[2i], x[2i+1]) is the complex number x[2i] + i x[2i+1]."""
    dr = 2 * cis.shape[-1]
    while cis.dim() < x.dim():
        cis = cis.unsqueeze(1)
    tail = torch.view_as_complex(wide(x[..., -dr:]).to(cis.real.dtype).unflatten(-1, (dr // 2, 2)).contiguous())
    rotated = torch.view_as_real(tail * (cis.conj() if inverse else cis)).flatten(-2)
    return torch.cat((x[..., :-dr], rotated.to(x.dtype)), dim=-1)


def heads(q: torch.Tensor, kv: torch.Tensor, cis: torch.Tensor, eps: float, kv_dtype: torch.dtype,
          idx_q: torch.Tensor | None = None, ring: tuple[torch.Tensor, "RingIndex"] | None = None,
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A layer's query and key heads before attention: q [T, Hl, D] per-head normed (no weight) and roped;
    kv [T, D] (after kv_norm) roped, in kv_dtype (the window cache's; uint8: FP8 rows [T, row bytes]
    quantized from the roped row in kv's dtype, so this step's readers see exactly what the ring will
    hold); idx_q [T, Ih, Id] (ratio 4) or None, roped. cis [T, Dr/2] at each token's position (for ratio
    4 the "compressed" angles, which the indexer uses too). ring = (window, its RingIndex) also writes the
    roped rows into the window ring now (`write_ring`): for steps of one token per sequence, where the row a
    token writes (position pos - W's) is one no token of the step reads. Returns (q, kv, idx_q)."""
    kv = apply_rotary(kv, cis)
    kv = quantize_rows(kv, 2 * cis.shape[-1]) if kv_dtype == torch.uint8 else kv.to(kv_dtype)
    if ring is not None:
        write_ring(ring[0], kv, ring[1])
    return apply_rotary(rms_norm(q, None, eps), cis), kv, apply_rotary(idx_q, cis) if idx_q is not None else None


def gather_rows(step_rows: torch.Tensor, ring: torch.Tensor, ix: "RingIndex") -> torch.Tensor:
    """Rows [E, R, C] of the positions ix describes for E tokens: from step_rows [T, C] where the
    position lies in this step's chunk, else from ring [slots, R, C] (which must not yet hold this
    step's rows)."""
    ring_rows = ring.view(-1, ring.shape[-1])[ix.ring_row]
    return torch.where(ix.in_step[..., None], step_rows[ix.step_row].to(ring.dtype), ring_rows)


def write_ring(ring: torch.Tensor, step_rows: torch.Tensor, ix: "RingIndex") -> None:
    """Store step_rows [T, C] where ix.write_row says: each sequence's newest R rows at slot, pos % R;
    the rest (older rows of a chunk, padding) in the trash slot."""
    ring.view(-1, ring.shape[-1])[ix.write_row] = step_rows.to(ring.dtype)


def indexer_topk(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor, n_valid: torch.Tensor,
                 n_keys: int, k: int, q_fp8: bool = False, key_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k compressed entries per token by the indexer score; -1 marks an empty pick.

    q [T, Ih, Id] (roped), w [T, Ih], keys [slots, N, Id] (or uint8 e4m3 codes [slots, N, Id]: FP8 keys, read
    dequantized with their scales key_scales fp32 [slots, N], then required), slot [T] each token's cache
    slot; token t may pick s < n_valid[t].
    I[t, s] = sum_h w[t, h] * Id^-0.5 * Ih^-0.5 * relu(q[t, h] . k[s]). Ties go to the lower index
    (stable sort) so that every implementation picks the same set. q_fp8 (runtime.indexer_q=e4m3): the score
    of q with each head's vector rounded as an FP8 key is stored (round_keys: e4m3, one power-of-two scale).
    """
    fp8 = keys.dtype == torch.uint8
    assert not fp8 or key_scales is not None, "FP8 keys need their key_scales"
    if q_fp8:
        q = round_keys(q)
    n_tok, n_heads, dim = q.shape
    k = min(k, n_keys)
    out = torch.full((n_tok, k), -1, dtype=torch.long, device=q.device)
    if k == 0:
        return out
    scale = dim ** -0.5 * n_heads ** -0.5
    ar = torch.arange(n_keys, device=q.device)
    for s, e in token_chunks(n_tok, n_keys * max(n_heads, dim)):
        kk = keys[slot[s:e], :n_keys]  # [t, N, Id]
        kk = dequantize_keys(kk, key_scales[slot[s:e], :n_keys]) if fp8 else wide(kk)
        qq = wide(q[s:e])
        logits = torch.einsum("thd,tnd->thn", qq, kk.to(qq.dtype)).relu_()
        score = torch.einsum("thn,th->tn", logits, w[s:e].to(qq.dtype)) * scale
        score.masked_fill_(ar[None] >= n_valid[s:e, None], float("-inf"))
        val, idx = torch.sort(score, dim=1, descending=True, stable=True)
        out[s:e] = torch.where(val[:, :k] > float("-inf"), idx[:, :k], -1)
    return out


def sparse_attention(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """o[t, h] = sum_j exp(s_j - m) row_j / (sum_j exp(s_j - m) + exp(sink_h - m)), fp32 (float64 for float64 q).

    q [T, H, D], rows [T, N, D] (each row is key and value), valid [T, N], sink [H].
    m = max(max_j s_j, sink_h); the sink enters the denominator only.
    """
    qf = wide(q)
    rf = rows.to(qf.dtype)
    s = torch.einsum("thd,tnd->thn", qf, rf) * scale
    s.masked_fill_(~valid[:, None, :], float("-inf"))
    sink = sink.to(qf.dtype)[None, :, None]  # [1, H, 1]
    m = torch.maximum(s.amax(-1, keepdim=True), sink)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True) + torch.exp(sink - m)
    return torch.einsum("thn,tnd->thd", p / denom, rf)


# ---------------------------------------------------------------- gated-pooling compressor


def compress_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, weight: torch.Tensor, eps: float,
                  blk: "BlockIndex", ring: "RingIndex", state: "RingState", out: torch.Tensor,
                  store: str = "plain", scales: torch.Tensor | None = None) -> None:
    """A compressor's stage B. kv, score [T, C] (C = c*D); ape [r, C] fp32; weight [D]; blk, ring: the
    BlockIndex of ratio r and the RingIndex of c*r rows; state rings [slots+1, c*r, C]; out [slots+1, N, D];
    store: "plain" (entries in out's dtype), "row" or "key" (FP8 of the layout into a uint8 out; "key": out
    gets the e4m3 codes [slots+1, N, D] and scales, fp32 [slots+1, N], each key's scale; else scales is None).

    Every token of the step is pooled as if it completed a block; the entries of tokens that
    do not (and of padding) land in the trash slot. That keeps this free of host decisions,
    hence capturable, at the price of pooling work for the tokens that complete nothing.
    """
    kv, score = wide(kv).to(state.kv.dtype), wide(score).to(state.kv.dtype) + ape[blk.phase]
    for s, e in token_chunks(len(score), state.kv.shape[1] * state.kv.shape[2]):
        pooled = _pool(kv, score, state, ring.tokens(s, e), ape.shape[0], weight.shape[0])
        entries = apply_rotary(rms_norm(pooled, weight, eps), blk.cis[s:e])
        dst = blk.emit_slot[s:e], blk.block[s:e]
        if store == "key":
            out[dst], scales[dst] = quantize_keys(entries)
        else:
            out[dst] = _stored(entries, store, 2 * blk.cis.shape[-1], out.dtype)
    write_ring(state.kv, kv, ring)  # after pooling: it read the ring's older rows
    write_ring(state.score, score, ring)


def _stored(entries: torch.Tensor, store: str, rope_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """fp32 entries [E, D] as a cache of rows stores them: in its dtype, or FP8 rows (uint8, store "row")."""
    return quantize_rows(entries, rope_dim) if store == "row" else entries.to(dtype)


def _pool(kv: torch.Tensor, score: torch.Tensor, state: "RingState", ix: "RingIndex", r: int,
          D: int) -> torch.Tensor:
    """Softmax-weighted sum per channel over the c*r tokens ending at each token of ix -> [E, D] fp32."""
    rows = gather_rows(kv, state.kv, ix)  # [E, c*r, c*D], oldest first
    gates = gather_rows(score, state.score, ix)
    if rows.shape[-1] == 2 * D:  # overlap: previous block contributes channels [0, D), current block [D, 2D)
        rows = torch.cat((rows[:, :r, :D], rows[:, r:, D:]), dim=1)
        gates = torch.cat((gates[:, :r, :D], gates[:, r:, D:]), dim=1)
    gates = gates.masked_fill(~ix.valid[..., None], float("-inf"))
    return (gates.softmax(dim=1) * rows).sum(dim=1)


# ---------------------------------------------------------------- attention over gathered candidates


def sparse_attention_sink(q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, ring: "RingIndex",
                          compressed: torch.Tensor | None, slot: torch.Tensor, picks: torch.Tensor | None,
                          n_done: torch.Tensor | None, n_comp: int, sink: torch.Tensor, scale: float,
                          cis: torch.Tensor, out: torch.Tensor) -> None:
    """Attention of T tokens: gather each token's candidates (its W window rows, oldest first, then its
    compressed rows), sparse attention with sink, inverse rotary; o into out [T, Hl*D].

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


# ------------------------------------------------------------------ twins of the fused launches
# The torch compositions that ops/add_rms_norm.py, ops/rms_norm_pair.py and ops/gemv.py each do in one
# launch: their semantics, and the references of tests/test_fused_kernels_gpu.py.


def add_rms_norm(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_new, x) = (h + y, RMSNorm(h + y) * weight): a layer's residual add, then the next layer's attn_norm."""
    h_new = h + y
    return h_new, rms_norm(h_new, weight, eps)


def rms_norm_pair(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q_norm and kv_norm: RMSNorm(a) * wa, RMSNorm(b) * wb."""
    return rms_norm(a, wa, eps), rms_norm(b, wb, eps)


def rms_norm_pair_rounded(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
    """rms_norm_pair, and the first output rounded per 1 x 128 block (`rounded_x`)."""
    ya, yb = rms_norm_pair(a, wa, b, wb, eps)
    return ya, yb, rounded_x(ya)


def add_rms_norm_rounded(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
    """add_rms_norm, and x rounded per 1 x 128 block (`rounded_x`)."""
    h_new, x = add_rms_norm(h, y, weight, eps)
    return h_new, x, rounded_x(x)


def rounded_x(x: torch.Tensor) -> RoundedX:
    """x [M, K] rounded per 1 x 128 block in act_quant's RoundedX layout: rows padded to ROUNDED_ROWS with zero
    rows, scales column-major."""
    mp = -(-len(x) // ROUNDED_ROWS) * ROUNDED_ROWS
    q, s = quantize_x_torch(torch.cat([x, x.new_zeros(mp - len(x), x.shape[1])]))
    return RoundedX(q, s.t().contiguous().t())


def gemv(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
         eps: float = 0.0) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T, behind RMSNorm(x) * norm_weight where given."""
    return torch.nn.functional.linear(x if norm_weight is None else rms_norm(x, norm_weight, eps), weight)


# ------------------------------------------------------------------ the step index (ops/step_index.py's twin)


def ring_rows(R: int, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
              last_pos: torch.Tensor, trash: int) -> tuple[torch.Tensor, ...]:
    """Where tokens (metadata rows [T] long) read and write a ring of R rows: (in_step, step_row, ring_row, valid
    [T, R], write_row [T]), ops/index.py's RingIndex."""
    qpos = pos[:, None] + torch.arange(1 - R, 1, device=pos.device)  # [T, R]
    rel = qpos - start_pos[:, None]  # >= 0: inside the step's chunk
    keep = torch.where(pos > last_pos - R, slot, trash)
    return (rel >= 0, (start_idx[:, None] + rel).clamp(min=0), slot[:, None] * R + qpos.remainder(R), qpos >= 0,
            keep * R + pos.remainder(R))


def block_rows(r: int, slot: torch.Tensor, pos: torch.Tensor, trash: int,
               table: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each token's compressed block for ratio r: (phase, block, emit_slot, n_done [T], cis [T, Dr/2] from the
    rotary table [P, Dr/2] at block * r), ops/index.py's BlockIndex."""
    block = pos.div(r, rounding_mode="floor")
    completes = (pos + 1).remainder(r) == 0
    return (pos.remainder(r), block, torch.where(completes, slot, trash), (pos + 1).div(r, rounding_mode="floor"),
            table[block * r])


def step_index(slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
               last_pos: torch.Tensor, trash: int, rings: Mapping[int, Sequence[torch.Tensor]],
               angles: Sequence[tuple[torch.Tensor, torch.Tensor]], blocks: Mapping[int, Sequence[torch.Tensor]],
               block_table: torch.Tensor | None) -> None:
    """The step index of T = len(pos) tokens, copied into the first T rows of its buffers (arguments: those of
    ops/step_index.py `step_index`)."""
    T = pos.shape[0]
    for R, out in rings.items():
        for dst, src in zip(out, ring_rows(R, slot, pos, start_idx, start_pos, last_pos, trash)):
            dst[:T].copy_(src)
    for table, out in angles:
        out[:T].copy_(table[pos])
    for r, out in blocks.items():
        for dst, src in zip(out, block_rows(r, slot, pos, trash, block_table)):
            dst[:T].copy_(src)


# ---------------------------------------------------------------- the backend of this path


@dataclass(frozen=True)
class TorchBackend:
    """The torch kernel backend (`ops/select.py`): every stage-B method is the twin above, on any device
    and dtype. Weight GEMMs with FP8 weights take `ops.linear.fp8_linear`'s path by device and shape, as on
    the Triton backend (its Triton GEMMs on CUDA, dequantize-then-matmul elsewhere)."""

    name: ClassVar[str] = "torch"
    pdl: ClassVar[bool] = False  # plain torch ops launch no kernel that could wait on its predecessor

    rms_norm = staticmethod(rms_norm)
    heads = staticmethod(heads)
    compress = staticmethod(compress_pool)
    indexer_topk = staticmethod(indexer_topk)
    sparse_attention = staticmethod(sparse_attention_sink)
    step_index = staticmethod(step_index)

    @staticmethod
    def add_rms_norm(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(h, y, weight, eps)

    @staticmethod
    def rms_norm_pair(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm_pair(a, wa, b, wb, eps)

    @staticmethod
    def add_rms_norm_rounded(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        return add_rms_norm_rounded(h, y, weight, eps)

    @staticmethod
    def rms_norm_pair_rounded(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        return rms_norm_pair_rounded(a, wa, b, wb, eps)

    @staticmethod
    def rounds_x_ahead(x: torch.Tensor, shapes: list[tuple[int, int]]) -> bool:
        """Never: the torch path's FP8 GEMMs round x as one expression of their own (nothing to spare)."""
        return False

    @staticmethod
    def linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
               eps: float = 0.0) -> torch.Tensor:
        """x [..., K] @ weight [N, K]^T, behind RMSNorm(x) * norm_weight where given (gemv's twin)."""
        return gemv(x, weight, norm_weight, eps)

    @staticmethod
    def linear_stream_safe(m: int, n: int, k: int) -> bool:
        """Always: plain matmuls."""
        return True

    @staticmethod
    def norm_prologue(m: int, shapes: list[tuple[int, int]]) -> bool:
        """Never: the torch path normalizes x once for all of its GEMMs."""
        return False

    @staticmethod
    def fp8_linear(x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1,
                   round_x: bool = False, rounded: RoundedX | None = None) -> torch.Tensor:
        """x [M, groups*K] @ dequantized FP8 qw [groups*N, K]^T; round_x: x rounded to e4m3 per 1 x 128 block first
        (the released model's GEMM, ops/fp8_gemm.py), else as given; rounded (that rounding, made ahead) is not
        read: the twin rounds x itself, to the same values. Never a Triton launch."""
        return fp8_gemm_torch(x, qw, scale, groups) if round_x else fp8_linear_torch(x, qw, scale, groups)

    @staticmethod
    def rotary(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
        """x [T, H, Dh] roped on its last Dr dims by cis [T, Dr/2] (the indexer query on its own branch)."""
        return apply_rotary(x, cis)
