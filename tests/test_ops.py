"""Unit checks of stage-B building blocks against direct formulas: rotary, YaRN, pooling, top-K, sink."""

from __future__ import annotations

import math

import pytest
import torch

from tp_runtime.config import load_config
from tp_runtime.ops.torch_path import indexer_topk, sparse_attention
from tp_runtime.reference import _frequencies
from tp_runtime.rope import RotaryTable, apply_rotary, inv_frequencies, yarn_correction_range
from conftest import TINY_PATH as TINY

torch.manual_seed(0)


def test_rotary_inverse_and_untouched_head():
    t = RotaryTable(8, 10000.0, None, 64, torch.device("cpu"))
    x = torch.randn(5, 3, 32, dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 30, 63])
    y = apply_rotary(x, t.at(pos))
    assert torch.equal(y[..., :24], x[..., :24])  # only the last Dr dims rotate
    assert torch.allclose(y[0], x[0], atol=1e-7)  # position 0: identity
    # fp32 tables: rotation then inverse rotation returns x to ~1e-6 (angles stored as complex64)
    assert torch.allclose(apply_rotary(y, t.at(pos), inverse=True), x, atol=1e-5)
    assert torch.allclose(y[..., 24:].norm(dim=-1), x[..., 24:].norm(dim=-1), rtol=1e-5)


def test_rotary_pairs_interleaved():
    # GPT-J form: pair (x[2i], x[2i+1]) turns by pos * f_i.
    t = RotaryTable(4, 100.0, None, 8, torch.device("cpu"))
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    y = apply_rotary(x, t.at(torch.tensor([3])))
    f0, f1 = 1.0, 100.0 ** -0.5
    expect = [math.cos(3 * f0), math.sin(3 * f0), -math.sin(3 * f1), math.cos(3 * f1)]
    assert torch.allclose(y[0], torch.tensor(expect, dtype=torch.float64), atol=1e-6)


def test_yarn_matches_the_formula_and_limits():
    cfg = load_config(TINY).model
    for dr in (8, 64):
        cfg.qk_rope_head_dim = dr
        f = inv_frequencies(dr, cfg.compress_rope_theta, cfg.rope_scaling)
        plain = inv_frequencies(dr, cfg.compress_rope_theta, None)
        assert torch.allclose(f, _frequencies(cfg, compressed=True), rtol=1e-12)
        lo, hi = yarn_correction_range(dr, cfg.compress_rope_theta, cfg.rope_scaling)
        i = torch.arange(dr // 2)
        assert torch.allclose(f[i <= lo], plain[i <= lo])  # high frequencies kept
        assert torch.allclose(f[i >= hi], plain[i >= hi] / 16)  # low frequencies interpolated by the factor


def test_sparse_attention_sink_is_denominator_only():
    q, rows = torch.randn(4, 2, 8, dtype=torch.float64), torch.randn(4, 5, 8, dtype=torch.float64)
    valid = torch.ones(4, 5, dtype=torch.bool)
    valid[0, 3:] = False
    scale = 8 ** -0.5
    no_sink = sparse_attention(q, rows, valid, torch.full((2,), -1e30), scale)
    logits = torch.einsum("thd,tnd->thn", q, rows) * scale
    logits = logits.masked_fill(~valid[:, None], float("-inf"))
    assert torch.allclose(no_sink, torch.einsum("thn,tnd->thd", logits.softmax(-1), rows).float(), atol=1e-6)
    sink = torch.tensor([0.5, 3.0])
    with_sink = sparse_attention(q, rows, valid, sink, scale)
    z = logits.exp().sum(-1, keepdim=True)  # [T, H, 1]
    shrink = (z / (z + sink.double().exp()[None, :, None])).float()
    assert torch.allclose(with_sink, no_sink * shrink, atol=1e-6)
    assert (with_sink.norm() < no_sink.norm())


class _B:  # the StepBatch fields indexer_topk reads
    def __init__(self, slot):
        self.slot = slot


def test_indexer_topk_masks_and_breaks_ties_low():
    # Two heads, weights (1, 1); keys chosen so that entries 1 and 2 tie exactly.
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # [1, Ih=2, Id=2]
    w = torch.ones(1, 2)
    keys = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.0, 2.0], [5.0, 5.0], [9.0, 9.0]]])  # [1 slot, 5, 2]
    picks = indexer_topk(q, w, keys, _B(torch.tensor([0])), torch.tensor([4]), 5, 2)
    assert picks.tolist() == [[3, 1]]  # entry 4 is invalid (s >= 4); 1 and 2 tie, the lower wins
    picks = indexer_topk(q, w, keys, _B(torch.tensor([0])), torch.tensor([1]), 5, 3)
    assert picks.tolist() == [[0, -1, -1]]  # fewer valid entries than K: the rest are empty



def test_seeded_weights_depend_only_on_seed_name_and_index():
    from tp_runtime.seeded import named_normal, normal, stream_key

    cpu = torch.device("cpu")
    w = named_normal(3, "layers.0.attn.wq_b.weight", (6, 4), cpu)
    key = torch.tensor(stream_key(3, "layers.0.attn.wq_b.weight"))
    assert torch.equal(w.flatten(), normal(key, torch.arange(24)))  # element i of the row-major order
    assert torch.equal(w[2:4], named_normal(3, "layers.0.attn.wq_b.weight", (6, 4), cpu)[2:4])
    assert not torch.allclose(w, named_normal(3, "layers.1.attn.wq_b.weight", (6, 4), cpu))
    assert not torch.allclose(w, named_normal(4, "layers.0.attn.wq_b.weight", (6, 4), cpu))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_seeded_weights_equal_on_cpu_and_gpu():
    from tp_runtime.seeded import named_normal

    a = named_normal(0, "w", (257, 129), torch.device("cpu"))
    b = named_normal(0, "w", (257, 129), torch.device("cuda")).cpu()
    # integer hashing is exact on both; only the float64 log / cos of Box-Muller may differ in the
    # last bits, far below float32 resolution
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
