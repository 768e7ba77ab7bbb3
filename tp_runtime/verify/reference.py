"""Test oracle: DSV4 attention written plainly from the spec, recomputing each sequence whole.

No caches, no rings, no chunks, no tensor parallelism: every layer sees a request's full history
[L, hidden] at once, with dense masks. Weights come by checkpoint name (`weights.full_tensors`),
usually upcast to float64. Slow on purpose; used only by tests and `tp-runtime check`.
"""

from __future__ import annotations

import math

import torch

from tp_runtime.config import ModelConfig

Weights = dict[str, torch.Tensor]


def _rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _frequencies(cfg: ModelConfig, compressed: bool) -> torch.Tensor:
    """Per-pair frequency, written as the spec's formula term by term."""
    dr = cfg.qk_rope_head_dim
    base = cfg.compress_rope_theta if compressed else cfg.rope_theta
    freqs = []
    for i in range(dr // 2):
        f = base ** (-2.0 * i / dr)
        if compressed:
            s = cfg.rope_scaling
            corr = lambda b: dr * math.log(s.original_max_position_embeddings / (2 * math.pi * b)) / (2 * math.log(base))
            lo, hi = max(0, math.floor(corr(s.beta_fast))), min(dr - 1, math.ceil(corr(s.beta_slow)))
            keep = 1 - min(max((i - lo) / max(hi - lo, 1e-3), 0.0), 1.0)
            f = f / s.factor * (1 - keep) + f * keep
        freqs.append(f)
    return torch.tensor(freqs, dtype=torch.float64)


def _rope(x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last len(freqs)*2 dims of x [L, ..., d] by sign * pos * f_i."""
    dr = 2 * freqs.numel()
    ang = sign * pos.to(torch.float64)[:, None] * freqs.to(x.device)[None]  # [L, dr/2]
    ang = ang.view(ang.shape[0], *([1] * (x.dim() - 2)), -1)
    c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    y = x.clone()
    a, b = x[..., -dr::2], x[..., -dr + 1::2]
    y[..., -dr::2], y[..., -dr + 1::2] = a * c - b * s, a * s + b * c
    return y


def _compress(x: torch.Tensor, w: Weights, p: str, r: int, dim: int, eps: float, freqs: torch.Tensor) -> torch.Tensor:
    """Entries [L // r, dim] of the completed blocks of one sequence."""
    kv = x @ w[p + "wkv.weight"].T
    score = x @ w[p + "wgate.weight"].T + w[p + "ape"][torch.arange(len(x), device=x.device) % r]
    entries = []
    for i in range(len(x) // r):
        cur = slice(i * r, (i + 1) * r)
        if r == 4:  # previous block through channels [0, dim), this block through [dim, 2 dim)
            prev = slice(max(i - 1, 0) * r, i * r)
            k = torch.cat((kv[prev, :dim], kv[cur, dim:]))
            s = torch.cat((score[prev, :dim], score[cur, dim:]))
        else:
            k, s = kv[cur], score[cur]
        entries.append((torch.softmax(s, dim=0) * k).sum(0))
    if not entries:
        return x.new_zeros(0, dim)
    e = _rms(torch.stack(entries), w[p + "norm.weight"], eps)
    return _rope(e, torch.arange(len(e), device=x.device) * r, freqs)


def _indexer_mask(x, qr, w: Weights, a: str, cfg: ModelConfig, freqs) -> torch.Tensor:
    """[L, L // 4] bool: the top-K valid compressed entries of each token (ties: lower index)."""
    L, Ih, Id = len(x), cfg.index_n_heads, cfg.index_head_dim
    pos = torch.arange(L, device=x.device)
    keys = _compress(x, w, a + "indexer.compressor.", 4, Id, cfg.rms_norm_eps, freqs)
    q = _rope((qr @ w[a + "indexer.wq_b.weight"].T).view(L, Ih, Id), pos, freqs)
    hw = x @ w[a + "indexer.weights_proj.weight"].T  # [L, Ih]
    score = torch.einsum("th,ths->ts", hw, torch.relu(torch.einsum("thd,sd->ths", q, keys))) / math.sqrt(Id * Ih)
    valid = torch.arange(len(keys), device=x.device)[None] < ((pos + 1) // 4)[:, None]
    score = score.masked_fill(~valid, float("-inf"))
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, : cfg.index_topk]
    mask = torch.zeros_like(valid)
    mask.scatter_(1, order, True)
    return mask & valid


def reference_attention(x: torch.Tensor, w: Weights, cfg: ModelConfig, layer: int) -> torch.Tensor:
    """One layer on a whole sequence: x [L, hidden] (already attn_norm'ed) -> [L, hidden]."""
    a, r, eps = f"layers.{layer}.attn.", cfg.compress_ratios[layer], cfg.rms_norm_eps
    L, H, D, G = len(x), cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
    pos = torch.arange(L, device=x.device)
    freqs = _frequencies(cfg, compressed=r > 0)
    qr = _rms(x @ w[a + "wq_a.weight"].T, w[a + "q_norm.weight"], eps)
    kv = _rope(_rms(x @ w[a + "wkv.weight"].T, w[a + "kv_norm.weight"], eps), pos, freqs)
    q = _rope(_rms((qr @ w[a + "wq_b.weight"].T).view(L, H, D), None, eps), pos, freqs)
    keys = kv
    mask = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - cfg.sliding_window)  # window [L, L]
    if r:
        entries = _compress(x, w, a + "compressor.", r, D, eps, freqs)
        if r == 4:
            cmask = _indexer_mask(x, qr, w, a, cfg, freqs)
        else:
            cmask = torch.arange(len(entries), device=x.device)[None] < ((pos + 1) // r)[:, None]
        keys, mask = torch.cat((kv, entries)), torch.cat((mask, cmask), dim=1)
    logits = torch.einsum("thd,sd->ths", q, keys) / math.sqrt(D)
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    sink = w[a + "attn_sink"].to(logits.dtype)[None, :, None].expand(L, H, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]  # sink: denominator only
    o = _rope(torch.einsum("ths,sd->thd", probs, keys), pos, freqs, sign=-1.0)
    wo_a = w[a + "wo_a.weight"].view(G, cfg.o_lora_rank, -1)
    z = torch.einsum("tgd,grd->tgr", o.reshape(L, G, -1), wo_a).reshape(L, -1)
    return z @ w[a + "wo_b.weight"].T


def reference_stack(x: torch.Tensor, w: Weights, cfg: ModelConfig) -> torch.Tensor:
    """The selected layers with pre-norm and residual: inputs [L, hidden] -> final hidden [L, hidden]."""
    h = x
    for i in cfg.layer_ids():
        h = h + reference_attention(_rms(h, w[f"layers.{i}.attn_norm.weight"], cfg.rms_norm_eps), w, cfg, i)
    return h
