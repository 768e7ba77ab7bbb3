"""The Gluon indexer score kernel (ops/indexer_scores_wgmma.py: FP8 keys, a 16-bit q) against the torch path's
scores, on random inputs.

Hopper only (a warpgroup MMA; Triton's interpreter does not run Gluon): elsewhere every test here is skipped with
that reason. The cases are tests/test_kernels_gpu.py's `topk_case` with the keys stored as FP8 (codes and scales).

- Integer inputs (q in -2..2, keys in -1..1, w in -2..2; the codes are 1 or 0 times a power-of-two scale): every
  product and partial sum is exact in fp32 in any order, so the scores equal the torch path's over the decoded
  keys bit for bit. A q column paired with another code byte (the kernel's permuted K order), a key scored with
  another key's scale, a block past a run's end or a missing head changes them.
- Float inputs: the kernel sums each dot's 128 products in another order than the fp64 reference (its K order is
  permuted), so a score differs by fp32 rounding. Each of a dot's additions is off by at most 2^-24 of the
  magnitudes summed so far, and likewise the 64 weighted head terms: at most (128 + 64) * 2^-24 < 2^-16 of
  scale * sum_h |w_h| sum_d |q_hd k_d| (q's per-head fp16 scaling and the key scales are powers of two: exact).
  Over terms of random sign the error is far smaller; a wrong pairing moves a score by its own size.
"""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_DEVICE, KERNEL_MARKS
from test_kernels_gpu import _scores, topk_case

from tp_runtime.ops.cache_fp8 import dequantize_keys, quantize_keys
from tp_runtime.ops.indexer_topk import _default_config, indexer_scores, topk_config
from tp_runtime.ops.kernel_support import gluon_hopper

DEV = KERNEL_DEVICE
pytestmark = KERNEL_MARKS + [pytest.mark.skipif(not gluon_hopper(DEV),
                                                reason="the wgmma score kernel needs a Hopper GPU and Gluon")]
N_KEYS = 4000
# key counts at the 64-key block edges, one key, none, all, and more valid keys than the cache holds
COUNTS = [0, 1, 63, 64, 65, 127, 128, 129, 500, 3999, N_KEYS, 9000]
FLOAT_TOL = 2.0 ** -16  # of scale * sum_h |w_h| sum_d |q_hd k_d| (module docstring)


def _wgmma_config(n_tokens: int, **change):
    cfg = topk_config(n_tokens, N_KEYS, 132, fp8=True, wgmma=True)._replace(**change)
    assert cfg.score_kernel == "wgmma"
    return cfg


def _fp8(q, w, keys, slot, nv):
    codes, scales = quantize_keys(keys)
    return (q, w, codes, slot, nv), scales, dequantize_keys(codes, scales).double()


def _reference(q, w, kf, slot):
    """Scores over the decoded keys kf [slots, N, Id] in fp64 -> (scores [T, N_KEYS], their scale of size)."""
    kk = kf[slot, :N_KEYS]
    dots = torch.einsum("thd,tnd->thn", q.double(), kk)
    scale = q.shape[2] ** -0.5 * q.shape[1] ** -0.5
    ref = torch.einsum("thn,th->tn", dots.relu(), w.double()) * scale
    size = torch.einsum("thn,th->tn", torch.einsum("thd,tnd->thn", q.double().abs(), kk.abs()), w.double().abs())
    return ref, size * scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("blocks", [1, 3, 8])
@pytest.mark.parametrize("heads", [64, 40])
def test_scores_on_integer_inputs_equal_the_torch_paths(dtype, stages, blocks, heads):
    args, scales, kf = _fp8(*topk_case(COUNTS, N_KEYS, dtype, seed=51, integer=True, n_heads=heads))
    got = indexer_scores(*args, N_KEYS, config=_wgmma_config(len(COUNTS), blocks=blocks, stages=stages),
                         key_scales=scales)
    ref = _scores(args[0], args[1], kf.float(), args[3], N_KEYS)  # fp32, as the kernel scales its sums
    for t, n in enumerate(COUNTS):
        m = min(n, N_KEYS)
        assert torch.equal(got[t, :m], ref[t, :m]), (t, n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scores_on_float_inputs_within_fp32_rounding(dtype):
    # heads' q spans 2^-12 .. 2^12 and keys' scales 2^-10 .. 2^10
    q, w, keys, slot, nv = topk_case(COUNTS, N_KEYS, dtype, seed=52, integer=False)
    q = (q.float() * torch.logspace(-12, 12, q.shape[1], base=2.0, device=DEV)[None, :, None]).to(dtype)
    keys = (keys.float() * torch.logspace(-10, 10, keys.shape[1], base=2.0, device=DEV)[None, :, None]).to(dtype)
    args, scales, kf = _fp8(q, w, keys, slot, nv)
    got = indexer_scores(*args, N_KEYS, config=_wgmma_config(len(COUNTS)), key_scales=scales)
    ref, size = _reference(q, w, kf, slot)
    for t, n in enumerate(COUNTS):
        m = min(n, N_KEYS)
        err = (got[t, :m].double() - ref[t, :m]).abs()
        assert bool((err <= FLOAT_TOL * size[t, :m]).all()), (t, float((err / size[t, :m]).max()))


def test_default_config_takes_the_wgmma_kernel_for_fp8_keys_only():
    q, w, keys, slot, nv = topk_case([10], N_KEYS, torch.bfloat16, seed=53, integer=True)
    codes, _ = quantize_keys(keys)
    assert _default_config(q, codes, N_KEYS, q_fp8=False).score_kernel == "wgmma"
    assert _default_config(q, keys, N_KEYS, q_fp8=False).score_kernel == "triton"  # bf16 keys
    assert _default_config(q, codes, N_KEYS, q_fp8=True).score_kernel == "triton"  # the FP8 dot
    assert _default_config(q.float(), codes, N_KEYS, q_fp8=False).score_kernel == "triton"  # fp32 q
