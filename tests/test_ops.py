"""Unit checks of stage-B building blocks against direct formulas: rotary, YaRN, pooling, top-K, sink."""

from __future__ import annotations

import math

import pytest
import torch

from tp_runtime.config import load_config
from tp_runtime.model.rope import RotaryTable, inv_frequencies, yarn_correction_range
from tp_runtime.ops.cache_fp8 import quantize_keys, round_keys
from tp_runtime.ops.torch_path import apply_rotary, indexer_topk, sparse_attention
from tp_runtime.verify.reference import _frequencies
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
    assert torch.allclose(no_sink, torch.einsum("thn,tnd->thd", logits.softmax(-1), rows), atol=1e-12)
    sink = torch.tensor([0.5, 3.0])
    with_sink = sparse_attention(q, rows, valid, sink, scale)
    z = logits.exp().sum(-1, keepdim=True)  # [T, H, 1]
    shrink = (z / (z + sink.double().exp()[None, :, None])).float()
    assert torch.allclose(with_sink, no_sink * shrink, atol=1e-6)
    assert (with_sink.norm() < no_sink.norm())


def test_indexer_topk_masks_and_breaks_ties_low():
    # Two heads, weights (1, 1); keys chosen so that entries 1 and 2 tie exactly.
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # [1, Ih=2, Id=2]
    w = torch.ones(1, 2)
    keys = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.0, 2.0], [5.0, 5.0], [9.0, 9.0]]])  # [1 slot, 5, 2]
    picks = indexer_topk(q, w, keys, torch.tensor([0]), torch.tensor([4]), 5, 2)
    assert picks.tolist() == [[3, 1]]  # entry 4 is invalid (s >= 4); 1 and 2 tie, the lower wins
    picks = indexer_topk(q, w, keys, torch.tensor([0]), torch.tensor([1]), 5, 3)
    assert picks.tolist() == [[0, -1, -1]]  # fewer valid entries than K: the rest are empty


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fp8_keys", [False, True])
def test_indexer_topk_q_fp8_scores_the_query_rounded_as_a_key(dtype, fp8_keys):
    # runtime.indexer_q=e4m3: the twin with q_fp8 is the unflagged twin on round_keys(q), exactly (each
    # (token, head) vector to e4m3 with its own power-of-two scale, in q's dtype), over plain or FP8 keys.
    g = torch.Generator().manual_seed(1)
    T, Ih, Id, N = 5, 4, 32, 300
    q = (torch.randn(T, Ih, Id, generator=g) * torch.logspace(-3, 3, T)[:, None, None]).to(dtype)
    q[0, 1] = 0.0  # a zero head: scale 1, codes 0
    w = torch.randn(T, Ih, generator=g).to(dtype)
    keys = torch.randn(3, N, Id, generator=g).to(dtype)
    keys, scales = quantize_keys(keys) if fp8_keys else (keys, None)  # FP8: codes [3, N, Id], scales [3, N]
    slot, nv = torch.tensor([0, 1, 2, 1, 0]), torch.tensor([300, 0, 7, 64, 250])
    rq = round_keys(q)
    assert rq.dtype == dtype and torch.equal(round_keys(rq), rq)  # exact in q's dtype: a rounded q stays put
    args = (w, keys, slot, nv, N, 16)
    got, plain = indexer_topk(q, *args, q_fp8=True, key_scales=scales), indexer_topk(q, *args, key_scales=scales)
    assert torch.equal(got, indexer_topk(rq, *args, key_scales=scales))
    assert torch.equal(indexer_topk(q, *args, q_fp8=False, key_scales=scales), plain)
    assert not torch.equal(got, plain)  # the rounding changes some picks



def test_seeded_weights_depend_only_on_seed_name_and_index():
    from tp_runtime.weights.seeded import named_normal, normal, stream_key

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
    from tp_runtime.weights.seeded import named_normal

    a = named_normal(0, "w", (257, 129), torch.device("cpu"))
    b = named_normal(0, "w", (257, 129), torch.device("cuda")).cpu()
    # integer hashing is exact on both; only the float64 log / cos of Box-Muller may differ in the
    # last bits, far below float32 resolution
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def test_step_index_rings_and_blocks_for_a_chunk_and_a_decode_token():
    """One step: slot 1 prefills positions 5..14 (10 tokens), slot 0 decodes position 20; ring of R = 4."""
    from tp_runtime.model.step_index import block_index, ring_index

    trash, R = 3, 4
    slot = torch.tensor([1] * 10 + [0])
    pos = torch.tensor(list(range(5, 15)) + [20])
    start_idx = torch.tensor([0] * 10 + [10])
    start_pos = torch.tensor([5] * 10 + [20])
    last_pos = torch.tensor([14] * 10 + [20])
    ix = ring_index(R, slot, pos, start_idx, start_pos, last_pos, trash)
    # Writes: only the chunk's newest R rows (positions 11..14) land in slot 1, at pos % R; the rest go to trash.
    assert ix.write_row[:6].tolist() == [trash * R + p % R for p in range(5, 11)]
    assert ix.write_row[6:10].tolist() == [1 * R + p % R for p in range(11, 15)]
    assert ix.write_row[10].item() == 0 * R + 20 % R
    # Reads of token at position 7: positions 4..7, oldest first; 4 from the ring, 5..7 from this step's rows 0..2.
    assert ix.in_step[2].tolist() == [False, True, True, True]
    assert ix.step_row[2, 1:].tolist() == [0, 1, 2]
    assert ix.ring_row[2, 0].item() == 1 * R + 4 % R
    # The decode token reads positions 17..20: 17..19 from slot 0's ring, 20 from its own step row 10.
    assert ix.in_step[10].tolist() == [False, False, False, True] and ix.step_row[10, 3].item() == 10
    assert ix.ring_row[10, :3].tolist() == [0 * R + p % R for p in (17, 18, 19)]
    assert ix.valid.all()  # no position below 0 here
    # Blocks of ratio 4: position 7 and 11 complete blocks 1 and 2; 20 sits in block 5 and completes nothing.
    table = RotaryTable(8, 100.0, None, 32, torch.device("cpu"))
    blk = block_index(4, slot, pos, trash, table)
    done = [p for p, s in zip(pos.tolist(), blk.emit_slot.tolist()) if s != trash]
    assert done == [7, 11] and blk.block[10].item() == 5 and blk.n_done[10].item() == 5
    assert torch.equal(blk.cis, table.at(blk.block * 4)) and blk.phase[10].item() == 0


def test_index_entries_as_low_words():
    """The Gluon attention kernels read int64 index entries as word 2j of their int32 view (`low_words`): exact for
    every entry in [-1, 2^31), on the step's shapes (rows of a larger buffer, a [T, 1] column of slots)."""
    from tp_runtime.ops.sparse_attention_wgmma import low_words

    buf = torch.tensor([[-1, 0, 1, 2**31 - 1], [5, -1, 2**20, 7], [3, 3, 3, 3]], dtype=torch.int64)
    for x in (buf, buf[:2], buf[1:, :3], buf[:, 2][:, None]):
        w = low_words(x)
        assert w.dtype == torch.int32 and w.shape == (x.shape[0], 2 * x.shape[1])
        assert w.stride(0) == 2 * x.stride(0) and w.data_ptr() == x.data_ptr()  # a view: no copy in the step
        assert torch.equal(w[:, 0::2].long(), x)
    with pytest.raises(AssertionError):
        low_words(buf.int())  # int32 entries would be read at the wrong words
