"""Test oracle: DSV4 attention written plainly from the spec, recomputing each sequence whole.

No caches, no rings, no chunks, no tensor parallelism: every layer sees a request's full history
[L, hidden] at once, with dense masks. Weights come by checkpoint name (`weights.full_tensors`),
usually upcast to float64. Slow on purpose; used only by tests and `tp-runtime check`.

With FP8 caches (cache_format="fp8") the oracle rounds what the runtime stores, where it is stored, as
the released model simulates it: each attention row's nope dims (the kv row after rotary and each
compressed entry) in blocks of 64 to e4m3 with a power-of-two scale, its rope dims to bf16; each indexer
key whole to e4m3 with one power-of-two scale. Written here from the spec (the scale 2^ceil(log2(amax /
448)), torch's e4m3 cast), not from ops/cache_fp8.py's bit operations. With runtime.indexer_q=e4m3
(indexer_q="e4m3") it rounds each head's indexer query (after rotary) the same way, where the run's indexer
rounds it before scoring.
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
            corr = lambda b: (dr * math.log(s.original_max_position_embeddings / (2 * math.pi * b))
                              / (2 * math.log(base)))
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


def _e4m3_round(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., n] rounded as stored: per block of `block` values s = 2^ceil(log2(amax / 448)) (1 for a zero
    block), x / s to the nearest e4m3 value, times s."""
    b = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = b.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax / 448.0))), torch.ones_like(amax))
    q = (b / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(x.dtype)
    return (q * s).reshape(x.shape)


def _act_round(x: torch.Tensor, on: bool) -> torch.Tensor:
    """An FP8 GEMM's input as the released model rounds it (on): per 1 x 128 block s = 2^ceil(log2(max(amax,
    1e-4) / 448)), x / s to the nearest e4m3 value, times s (DeepSeek's act_quant with power-of-two scales)."""
    if not on:
        return x
    n = x.shape[-1]
    b = torch.nn.functional.pad(x, (0, -n % 128)).unflatten(-1, (-1, 128))  # a last, partial block: zero-padded
    s = torch.exp2(torch.ceil(torch.log2(b.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0)))
    return ((b / s).to(torch.float8_e4m3fn).to(x.dtype) * s).flatten(-2)[..., :n]


def _stored_row(x: torch.Tensor, dr: int, fp8: bool) -> torch.Tensor:
    """An attention row [..., D] as the cache gives it back: nope dims e4m3 per 64, rope dims bf16."""
    if not fp8:
        return x
    return torch.cat((_e4m3_round(x[..., :-dr], 64), x[..., -dr:].to(torch.bfloat16).to(x.dtype)), dim=-1)


def _stored_key(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """An indexer key [..., Id] as the cache gives it back: e4m3 with one scale for the whole key."""
    return _e4m3_round(x, x.shape[-1]) if fp8 else x


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


def _indexer_mask(x, qr, w: Weights, a: str, cfg: ModelConfig, freqs, fp8: bool = False,
                  round_x: bool = False, round_q: bool = False) -> torch.Tensor:
    """[L, L // 4] bool: the top-K valid compressed entries of each token (ties: lower index). round_q: each
    head's query scored as an FP8 key is stored (e4m3, one power-of-two scale)."""
    L, Ih, Id = len(x), cfg.index_n_heads, cfg.index_head_dim
    pos = torch.arange(L, device=x.device)
    keys = _stored_key(_compress(x, w, a + "indexer.compressor.", 4, Id, cfg.rms_norm_eps, freqs), fp8)
    q = _rope((_act_round(qr, round_x) @ w[a + "indexer.wq_b.weight"].T).view(L, Ih, Id), pos, freqs)
    q = _stored_key(q, round_q)
    hw = x @ w[a + "indexer.weights_proj.weight"].T  # [L, Ih]
    score = torch.einsum("th,ths->ts", hw, torch.relu(torch.einsum("thd,sd->ths", q, keys))) / math.sqrt(Id * Ih)
    valid = torch.arange(len(keys), device=x.device)[None] < ((pos + 1) // 4)[:, None]
    score = score.masked_fill(~valid, float("-inf"))
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, : cfg.index_topk]
    mask = torch.zeros_like(valid)
    mask.scatter_(1, order, True)
    return mask & valid


def reference_attention(x: torch.Tensor, w: Weights, cfg: ModelConfig, layer: int,
                        cache_format: str = "bf16", round_x: bool = False, indexer_q: str = "bf16") -> torch.Tensor:
    """One layer on a whole sequence: x [L, hidden] (already attn_norm'ed) -> [L, hidden]. cache_format
    "fp8": cached rows and keys rounded as the FP8 caches store them; round_x: the inputs of the FP8 GEMMs
    (wq_a, wkv, wq_b, indexer.wq_b, wo_a, wo_b) rounded to e4m3 as the released model's GEMMs round them;
    indexer_q "e4m3": the indexer's query rounded as an FP8 key is stored (runtime.indexer_q)."""
    fp8, dr = cache_format == "fp8", cfg.qk_rope_head_dim
    a, r, eps = f"layers.{layer}.attn.", cfg.compress_ratios[layer], cfg.rms_norm_eps
    L, H, D, G = len(x), cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
    pos = torch.arange(L, device=x.device)
    freqs = _frequencies(cfg, compressed=r > 0)
    xr = _act_round(x, round_x)
    qr = _rms(xr @ w[a + "wq_a.weight"].T, w[a + "q_norm.weight"], eps)
    kv = _stored_row(_rope(_rms(xr @ w[a + "wkv.weight"].T, w[a + "kv_norm.weight"], eps), pos, freqs), dr, fp8)
    q = _rope(_rms((_act_round(qr, round_x) @ w[a + "wq_b.weight"].T).view(L, H, D), None, eps), pos, freqs)
    keys = kv
    mask = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - cfg.sliding_window)  # window [L, L]
    if r:
        entries = _stored_row(_compress(x, w, a + "compressor.", r, D, eps, freqs), dr, fp8)
        if r == 4:
            cmask = _indexer_mask(x, qr, w, a, cfg, freqs, fp8, round_x, indexer_q == "e4m3")
        else:
            cmask = torch.arange(len(entries), device=x.device)[None] < ((pos + 1) // r)[:, None]
        keys, mask = torch.cat((kv, entries)), torch.cat((mask, cmask), dim=1)
    logits = torch.einsum("thd,sd->ths", q, keys) / math.sqrt(D)
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    sink = w[a + "attn_sink"].to(logits.dtype)[None, :, None].expand(L, H, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]  # sink: denominator only
    o = _rope(torch.einsum("ths,sd->thd", probs, keys), pos, freqs, sign=-1.0)
    wo_a = w[a + "wo_a.weight"].view(G, cfg.o_lora_rank, -1)
    z = torch.einsum("tgd,grd->tgr", _act_round(o.reshape(L, -1), round_x).view(L, G, -1), wo_a).reshape(L, -1)
    return _act_round(z, round_x) @ w[a + "wo_b.weight"].T


def reference_stack(x: torch.Tensor, w: Weights, cfg: ModelConfig, cache_format: str = "bf16",
                    round_x: bool = False, indexer_q: str = "bf16") -> torch.Tensor:
    """The selected layers with pre-norm and residual: inputs [L, hidden] -> final hidden [L, hidden]
    (round_x, indexer_q: reference_attention's)."""
    h = x
    for i in cfg.layer_ids():
        h = h + reference_attention(_rms(h, w[f"layers.{i}.attn_norm.weight"], cfg.rms_norm_eps), w, cfg, i,
                                    cache_format, round_x, indexer_q)
    return h
