"""Plain torch kernels of stage B: row gathers from ring caches, indexer top-K, sparse attention with sink.

These run on CPU and GPU alike and define the semantics any faster kernel must reproduce.
Work is split into token chunks so that gathered candidates stay within a fixed memory budget.
"""

from __future__ import annotations

import torch

from tp_runtime.batch import StepBatch

# Elements (not bytes) one chunk of gathered candidates may occupy; bounds peak memory of long prefills.
CHUNK_ELEMENTS = 1 << 25


def token_chunks(n_tokens: int, per_token: int) -> list[tuple[int, int]]:
    """[start, end) token ranges whose gathered candidates stay under CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    return [(s, min(s + step, n_tokens)) for s in range(0, n_tokens, step)]


def gather_rows(step_rows: torch.Tensor, ring: torch.Tensor, b: StepBatch, tok: torch.Tensor,
                qpos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows at absolute positions qpos [E, n] of the sequences of tokens tok [E].

    A position inside this step's chunk of that sequence comes from step_rows [T, C] (the ring may
    already have been overwritten by the chunk); an earlier one from ring [slots, R, C] at pos % R.
    Returns rows [E, n, C] and valid [E, n] (position >= 0). The ring must not yet hold this step's rows.
    """
    start_pos = b.start_pos[tok][:, None]
    in_step = qpos >= start_pos
    step_idx = (b.start_idx[tok][:, None] + (qpos - start_pos)).clamp(0, step_rows.shape[0] - 1)
    ring_rows = ring[b.slot[tok][:, None], qpos.remainder(ring.shape[1])]
    rows = torch.where(in_step[..., None], step_rows[step_idx].to(ring.dtype), ring_rows)
    return rows, qpos >= 0


def write_ring(ring: torch.Tensor, step_rows: torch.Tensor, b: StepBatch) -> None:
    """Store each sequence's newest R rows of this step at ring[slot, pos % R]; older rows of the
    chunk (which would collide with them) and padding go to the trash slot (the ring's last row)."""
    R = ring.shape[1]
    slot = torch.where(b.pos > b.last_pos - R, b.slot, ring.shape[0] - 1)
    ring[slot, b.pos.remainder(R)] = step_rows.to(ring.dtype)


def indexer_topk(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, b: StepBatch, n_valid: torch.Tensor,
                 n_keys: int, k: int) -> torch.Tensor:
    """Top-k compressed entries per token by the indexer score; -1 marks an empty pick.

    q [T, Ih, Id] (roped), w [T, Ih], keys [slots, N, Id]; token t may pick s < n_valid[t].
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
        kk = keys[b.slot[s:e], :n_keys].float()  # [t, N, Id]
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
