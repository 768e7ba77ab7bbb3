"""Plain torch kernels of stage B: row gathers from ring caches, indexer top-K, sparse attention with sink.

These run on CPU and GPU alike and define the semantics any faster kernel must reproduce.
Work is split into token chunks so that gathered candidates stay within a fixed memory budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tp_runtime.ops.cache_fp8 import dequantize_keys

if TYPE_CHECKING:  # ops take plain tensors and index tuples; nothing of the model is imported at run time
    from tp_runtime.model.step_index import RingIndex

# Elements (not bytes) one chunk of gathered candidates may occupy; bounds peak memory of long prefills.
CHUNK_ELEMENTS = 1 << 25


def token_chunks(n_tokens: int, per_token: int) -> list[tuple[int, int]]:
    """[start, end) token ranges whose gathered candidates stay under CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    return [(s, min(s + step, n_tokens)) for s in range(0, n_tokens, step)]


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
                 n_keys: int, k: int) -> torch.Tensor:
    """Top-k compressed entries per token by the indexer score; -1 marks an empty pick.

    q [T, Ih, Id] (roped), w [T, Ih], keys [slots, N, Id] (or uint8 [slots, N, Id + 4]: FP8 keys, read
    dequantized), slot [T] each token's cache slot; token t may pick s < n_valid[t].
    I[t, s] = sum_h w[t, h] * Id^-0.5 * Ih^-0.5 * relu(q[t, h] . k[s]). Ties go to the lower index
    (stable sort) so that every implementation picks the same set.
    """
    n_tok, n_heads, dim = q.shape
    k = min(k, n_keys)
    out = torch.full((n_tok, k), -1, dtype=torch.long, device=q.device)
    if k == 0:
        return out
    scale = dim ** -0.5 * n_heads ** -0.5
    ar = torch.arange(n_keys, device=q.device)
    for s, e in token_chunks(n_tok, n_keys * max(n_heads, dim)):
        kk = keys[slot[s:e], :n_keys]  # [t, N, Id] (uint8 [t, N, Id + 4] with FP8 keys)
        kk = dequantize_keys(kk, dim) if kk.dtype == torch.uint8 else kk.float()
        logits = torch.einsum("thd,tnd->thn", q[s:e].float(), kk).relu_()
        score = torch.einsum("thn,th->tn", logits, w[s:e].float()) * scale
        score.masked_fill_(ar[None] >= n_valid[s:e, None], float("-inf"))
        val, idx = torch.sort(score, dim=1, descending=True, stable=True)
        out[s:e] = torch.where(val[:, :k] > float("-inf"), idx[:, :k], -1)
    return out


def sparse_attention(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """o[t, h] = sum_j exp(s_j - m) row_j / (sum_j exp(s_j - m) + exp(sink_h - m)), fp32.

    q [T, H, D], rows [T, N, D] (each row is key and value), valid [T, N], sink [H].
    m = max(max_j s_j, sink_h); the sink enters the denominator only.
    """
    rf = rows.float()
    s = torch.einsum("thd,tnd->thn", q.float(), rf) * scale
    s.masked_fill_(~valid[:, None, :], float("-inf"))
    sink = sink.float()[None, :, None]  # [1, H, 1]
    m = torch.maximum(s.amax(-1, keepdim=True), sink)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True) + torch.exp(sink - m)
    return torch.einsum("thn,tnd->thd", p / denom, rf)


# ------------------------------------------------------------------ twins of the fused launches
# The torch compositions that ops/add_rms_norm.py, ops/rms_norm_pair.py and ops/gemv.py each do in one
# launch: their semantics, and the references of tests/test_fused_kernels_gpu.py.


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """y = w * x * rsqrt(mean(x^2) + eps) over the last dim in fp32, one cast to x's dtype: the expression
    of model/layers.py's `rms_norm`."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.float()).to(x.dtype)


def add_rms_norm(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_new, x) = (h + y, RMSNorm(h + y) * weight): a layer's residual add, then the next layer's attn_norm."""
    h_new = h + y
    return h_new, rms_norm_rows(h_new, weight, eps)


def rms_norm_pair(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q_norm and kv_norm: RMSNorm(a) * wa, RMSNorm(b) * wb."""
    return rms_norm_rows(a, wa, eps), rms_norm_rows(b, wb, eps)


def gemv(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
         eps: float = 0.0) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T, behind RMSNorm(x) * norm_weight where given."""
    return torch.nn.functional.linear(x if norm_weight is None else rms_norm_rows(x, norm_weight, eps), weight)
