"""The FP8 GEMM family's semantics on the CPU (ops/fp8_gemm.py's torch twins) and its tuning table
(ops/fp8_gemm_table.py): x rounded per 1 x 128 block to e4m3 with the power-of-two scale of DeepSeek's act_quant,
the block-scaled product, the table's lookup, and a missing shape's fallback with one warning."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from conftest import ROOT
from tp_runtime.config import load_config
from tp_runtime.ops.act_quant import e4m3_exponents_torch, quantize_x_torch
from tp_runtime.ops.fp8_gemm import Fp8GemmConfig, default_config, fp8_gemm_torch
from tp_runtime.ops.fp8_gemm_table import M_BUCKETS, TABLE_PATH, Fp8GemmTable, m_bucket, shape_key
from tp_runtime.ops.fp8_gemm_wgmma import WS_MAX_TILE, wgmma_fits
from tp_runtime.ops.linear import dequantize
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import fp8_gemm_shapes


def test_scale_exponent_is_ceil_log2_of_amax_over_448():
    # from amax's bits, exactly 2^ceil(log2(amax / 448)) as float64 computes it, across 60 binades and at the
    # edges (448 * 2^k itself, one ulp above it)
    g = torch.Generator().manual_seed(0)
    amax = torch.exp2(torch.rand(10000, generator=g) * 60 - 13).float()
    edges = torch.tensor([448.0 * 2.0 ** k for k in range(-12, 12)])
    amax = torch.cat([amax, edges, torch.nextafter(edges, torch.tensor(math.inf)), torch.tensor([1e-4])])
    want = torch.ceil(torch.log2(amax.double() / 448.0)).int()
    assert torch.equal(e4m3_exponents_torch(amax), want)


def test_quantize_x_blocks():
    x = torch.randn(3, 300, dtype=torch.float64) * torch.logspace(-8, 4, 300, dtype=torch.float64)
    x[1] = 0
    q, s = quantize_x_torch(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (3, 300) and s.shape == (3, 3)
    assert torch.equal(torch.log2(s).round(), torch.log2(s))  # powers of two
    blocks = torch.nn.functional.pad(x, (0, 84)).view(3, 3, 128)
    amax = blocks.abs().amax(-1).clamp_min(1e-4)
    assert (amax / s <= 448).all() and (amax / s > 224).all()  # the smallest power of two that fits
    assert (s[1] == 2.0 ** -22).all()  # all-zero blocks: DeepSeek's floor of 1e-4 on amax
    assert not q[1].float().any()
    back = q.double() * s.repeat_interleave(128, 1)[:, :300]
    big = x.abs() > 2.0 ** -6 * s.repeat_interleave(128, 1)[:, :300]  # e4m3 normals: 3 mantissa bits
    assert ((back - x).abs()[big] <= 2.0 ** -4 * x.abs()[big]).all()


def test_fp8_gemm_torch_is_the_product_of_rounded_x_and_dequantized_w():
    torch.manual_seed(1)
    q, s = quantize_fp8(torch.randn(256, 512) * torch.logspace(-3, 3, 256)[:, None])
    x = torch.randn(5, 2 * 512)
    y = fp8_gemm_torch(x, q, s, groups=2)
    w = dequantize(q, s, torch.float32)
    for g in range(2):
        xq, xs = quantize_x_torch(x[:, g * 512:(g + 1) * 512])
        xr = xq.float() * xs.repeat_interleave(128, 1)
        torch.testing.assert_close(y[:, g * 128:(g + 1) * 128], xr @ w[g * 128:(g + 1) * 128].T)
    assert TorchBackend().fp8_linear(x, q, s, groups=2, round_x=True).equal(y)
    assert not TorchBackend().fp8_linear(x, q, s, groups=2).equal(y)  # x as given: no rounding


def test_m_buckets():
    assert [m_bucket(m) for m in (1, 2, 3, 17, 128, 129, 512, 4096)] == [1, 2, 4, 32, 128, 256, 512, 512]


def test_a_missing_shape_falls_back_and_warns_once():
    table = Fp8GemmTable({shape_key(256, 512, 1): {b: Fp8GemmConfig("triton", 16, 64, 2, 4, 3, True)
                                                  for b in M_BUCKETS}}, "a test table")
    x = torch.zeros(3, 512)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert table.config(3, 256, 512, 1, x, 132) == Fp8GemmConfig("triton", 16, 64, 2, 4, 3, True)
        for m in (1, 40, 300):
            assert table.config(m, 1024, 512, 1, x, 132) == default_config(m, 1024, 512, 132)
        assert table.config(1, 768, 512, 1, x, 132) == default_config(1, 768, 512, 132)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "N=1024 K=512 groups=1 is not in the tuning table a test table" in messages[0]
    # cuBLASLt's choice where it cannot run (a CPU tensor here): the default launch, one warning
    table = Fp8GemmTable({shape_key(256, 512, 1): {b: Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False)
                                                  for b in M_BUCKETS}})
    with pytest.warns(UserWarning, match="cannot run here"):
        assert table.config(64, 256, 512, 1, x, 132).kernel == "triton"
    # the Gluon kernel's choice where it cannot run (not a Hopper GPU: a CPU tensor here): the same
    for kernel in ("wgmma", "wgmma_ws"):
        table = Fp8GemmTable({shape_key(256, 512, 1): {b: Fp8GemmConfig(kernel, 64, 64, 1, 4, 4, False)
                                                      for b in M_BUCKETS}})
        with pytest.warns(UserWarning, match="Gluon kernel.*cannot run here"):
            assert table.config(64, 256, 512, 1, x, 132) == default_config(64, 256, 512, 132)


def test_default_config_fits_every_size():
    for m in (1, 7, 64, 513):
        for n, k in ((1536, 4096), (4096, 1024), (256, 200)):
            c = default_config(m, n, k, 132)
            assert 16 <= c.block_m <= 128 and c.block_n == 128 and 1 <= c.splits <= max(1, k // 128 // 4)


def test_the_committed_table_covers_flash_and_pro_at_tp_1_2_4_and_8():
    raw = json.loads(TABLE_PATH.read_text())
    assert {"gpu", "torch", "triton", "command"} <= set(raw["meta"])
    table = Fp8GemmTable.load()
    for name in ("v4_flash", "v4_pro"):
        for tp in (1, 2, 4, 8):
            for n, k, groups in fp8_gemm_shapes(load_config(ROOT / "configs" / f"{name}.yaml").model, tp).values():
                by_m = table.entries[shape_key(n, k, groups)]
                assert sorted(by_m) == list(M_BUCKETS)
                for bucket, c in by_m.items():
                    assert c.kernel in ("triton", "wgmma", "wgmma_ws", "gemv", "scaled_mm")
                    if c.kernel == "triton":
                        assert (n // groups) % c.block_n == 0 and c.block_m >= 16 and c.block_k == 128
                    if c.kernel == "wgmma":  # whole K blocks, a tile's rows in one group, x rounded by one launch
                        assert bucket >= 8 and wgmma_fits(n, k, groups, c.block_n) and c.block_n in (64, 128, 256)
                        assert c.in_flight in (0, 1) and not c.quant_x and 1 <= c.splits <= k // 128
                    if c.kernel == "wgmma_ws":  # the same, and a tile's two fp32 copies in the MMA warps' registers
                        assert bucket >= 8 and wgmma_fits(n, k, groups, c.block_n) and c.num_warps in (4, 8)
                        assert c.block_n * c.block_m <= WS_MAX_TILE * c.num_warps // 4 and not c.quant_x
                    if c.kernel == "gemv":  # one row, whole 128-column blocks a K step
                        assert bucket == 1 and c.block_m == 1 and c.block_k % 128 == 0
