"""The FP8 GEMM family (ops/fp8_gemm.py) on a GPU: x rounded to e4m3 by the kernels bit for bit as the torch twin
rounds it; every launch the tuning table holds, and the defaults, against the twin at every FP8 weight shape of
Flash and Pro at tp 1 and 8 and M in {1, 3, 8, 33, 128, 256, 512}, with weight scales spanning orders of
magnitude; the Gluon kernel (ops/fp8_gemm_wgmma.py) at every such shape from M = 8; split-K deterministic and the
same in a CUDA graph; the backend's choice against the torch backend.

Run on a GPU machine: `pytest -m gpu tests/test_fp8_gemm_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT
from tp_runtime.config import load_config
from tp_runtime.model.stack import AttentionStack
from tp_runtime.ops.act_quant import quantize_x_torch
from tp_runtime.ops.fp8_gemm import (Fp8GemmConfig, default_config, fp8_gemm, fp8_gemm_torch, quantize_x,
                                     takes_rounded_x)
from tp_runtime.ops.fp8_gemm_table import Fp8GemmTable
from tp_runtime.ops.kernel_support import gluon_hopper
from tp_runtime.ops.linear import blockwise_scaled_mm_available
from tp_runtime.ops.rms_norm_pair import rms_norm_pair_rounded
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.ops.triton_path import TritonBackend
from tp_runtime.parallel.group import TPGroup
from tp_runtime.weights.fill import init_seeded
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import fp8_gemm_shapes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Kernel and twin multiply the same e4m3 values (x rounded identically: test_quantize_*), whose products are exact
# in fp32; they differ in the order of the fp32 sums (~1e-6 relative) and round each output to bf16 (at most 2^-9
# relative, less in norm), so 4e-3 in norm; a wrong scale (a factor of 2 at least) or a missing block is >= 1e-1.
TOL = 4e-3
MS = [1, 3, 8, 33, 128, 256, 512]


def fp8_shapes(name: str, tp: int) -> set[tuple[int, int, int]]:
    """(N, K, groups) of every FP8 GEMM one rank runs (weights/specs.py)."""
    return set(fp8_gemm_shapes(load_config(ROOT / "configs" / f"{name}.yaml").model, tp).values())


SHAPES = sorted({s for name in ("v4_flash", "v4_pro") for tp in (1, 8) for s in fp8_shapes(name, tp)})


def _weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
    w *= torch.logspace(-3, 3, -(-n // 128), device="cuda").repeat_interleave(128)[:n, None]  # scales over 6 decades
    return quantize_fp8(w)


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_x_kernel_rounds_as_the_twin(dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(37, 1024, device="cuda", generator=g) * torch.logspace(-8, 4, 1024, device="cuda")
    x[3] = 0  # all-zero blocks: the 1e-4 floor
    x[5, :128] = 448.0 * 2.0 ** torch.arange(-4, 4, device="cuda").repeat(16)  # amax exactly 448 * 2^k
    x[6, :128] = 452.0  # just above (exact in bf16): the next power of two
    x = x.to(dtype)
    q, s = quantize_x(x)
    qt, st = quantize_x_torch(x)
    assert torch.equal(s[:37], st)
    assert torch.equal(q[:37].view(torch.uint8), qt.view(torch.uint8))
    assert float(st[3, 0]) == 2.0 ** -22  # 1e-4 / 448 -> 2^ceil(-22.03)
    assert float(st[6, 0]) == 2.0


@pytest.mark.parametrize("n,k,groups", SHAPES)
def test_table_and_default_launches_match_the_twin(n, k, groups):
    q, s = _weights(n, k, n + k)
    table, g = Fp8GemmTable.load(), torch.Generator(device="cuda").manual_seed(k)
    for m in MS:
        x = torch.randn(m, groups * k, device="cuda", generator=g).to(torch.bfloat16)
        ref = fp8_gemm_torch(x, q, s, groups)
        for c in (table.config(m, n, k, groups, x, 132), default_config(m, n, k, 132)):
            y = fp8_gemm(x, q, s, groups, c)
            assert y.isfinite().all() and _err(y, ref) < TOL, (n, k, groups, m, c, _err(y, ref))


# (in_flight, block_m, block_n, warps): one MMA left in flight or none; 256 weight rows span two scale blocks
WGMMA_TILES = [(1, 16, 128, 4), (1, 64, 64, 4), (1, 32, 256, 8), (0, 128, 128, 8), (0, 64, 256, 8)]
# the warp-specialized kernel's (block_m, block_n, warps, stages, K steps a wait): one MMA warpgroup, or two each
# taking half the weight rows (256: each its own scale block), rings of 4-8, 1 / 2 / 4 steps a wait (K splits of
# 3 leave a last wait with steps past the split's end)
# the GEMV's (rows, K step, warps): 1 to 8 scale blocks a step (K = 1000 ends inside one), 4 and 8 warps
GEMV_TILES = [(16, 512, 4), (32, 256, 4), (16, 128, 4), (16, 1024, 8), (64, 256, 8), (32, 512, 8)]
WS_TILES = [(16, 128, 4, 8, 4), (64, 64, 4, 6, 2), (128, 64, 4, 4, 1), (128, 128, 8, 4, 1), (32, 256, 8, 4, 2)]


@pytest.mark.parametrize("quant_x", [True, False])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_every_launch_kind(quant_x, splits):
    # Both x paths, uneven K splits, 64- and 128-row tiles, M tiles over 128 rows, the Gluon kernel (M and N tails
    # zero-filled by TMA, groups), the GEMV at M = 1 (16 to 64 rows, K steps of 1 to 8 blocks); K = 1000 ends
    # inside a block (the Gluon launch falls back to the Triton kernel there).
    for n, k, groups in [(4096, 1024, 1), (2048, 4096, 2), (256, 1000, 1)]:
        q, s = _weights(n, k, splits)
        for m in (1, 5, 64, 300):
            x = torch.randn(m, groups * k, device="cuda").to(torch.bfloat16)
            ref = fp8_gemm_torch(x, q, s, groups)
            for bn in (64, 128):
                c = Fp8GemmConfig("triton", min(128, max(16, 1 << (m - 1).bit_length())), bn, splits, 4, 3, quant_x)
                assert _err(fp8_gemm(x, q, s, groups, c), ref) < TOL, (n, k, m, c)
            for f, bm, bn, warps in WGMMA_TILES if not quant_x else ():  # the Gluon kernel, stages fed by TMA
                c = Fp8GemmConfig("wgmma", bm, bn, splits, warps, 4, False, in_flight=f)
                assert _err(fp8_gemm(x, q, s, groups, c), ref) < TOL, (n, k, m, c)
            for bm, bn, warps, stages, kpw in WS_TILES if not quant_x else ():  # warp-specialized, PDL or not
                c = Fp8GemmConfig("wgmma_ws", bm, bn, splits, warps, stages, False, k_per_wait=kpw)
                for pdl in (False, True):
                    assert _err(fp8_gemm(x, q, s, groups, c, pdl), ref) < TOL, (n, k, m, c, pdl)
            for bn, bk, warps in GEMV_TILES if m == 1 and quant_x else ():  # the GEMV rounding x, PDL or not
                c = Fp8GemmConfig("gemv", 1, bn, splits, warps, 3, True, bk)
                for pdl in (False, True):
                    assert _err(fp8_gemm(x, q, s, groups, c, pdl), ref) < TOL, (n, k, m, c, pdl)


@pytest.mark.skipif(not torch.cuda.is_available() or not gluon_hopper(torch.device("cuda")),
                    reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("n,k,groups", SHAPES)
def test_gluon_launch_at_every_shape(n, k, groups):
    # Every FP8 weight of Flash and Pro at tp 1 and 8, every M the tuner tries it at, a tile of each kind (one MMA
    # in flight; each MMA waited, 256 weight rows over two scale blocks where the group's rows allow), K split.
    q, s = _weights(n, k, 7 * n + k)
    g = torch.Generator(device="cuda").manual_seed(n)
    for m in (8, 33, 128, 256, 512):
        x = torch.randn(m, groups * k, device="cuda", generator=g).to(torch.bfloat16)
        ref = fp8_gemm_torch(x, q, s, groups)
        for f, bm, bn, warps in ((1, 32, 64, 4), (0, 64, 256, 8), (0, 128, 128, 8)):
            if (n // groups) % bn:
                continue
            c = Fp8GemmConfig("wgmma", bm, bn, 1 if m > 128 else 3, warps, 4, False, in_flight=f)
            y = fp8_gemm(x, q, s, groups, c)
            assert y.isfinite().all() and _err(y, ref) < TOL, (n, k, groups, m, c, _err(y, ref))
        for bm, bn, warps, stages, kpw in WS_TILES:
            if (n // groups) % bn:
                continue
            c = Fp8GemmConfig("wgmma_ws", bm, bn, 1 if m > 128 else 3, warps, stages, False, k_per_wait=kpw)
            y = fp8_gemm(x, q, s, groups, c, pdl=True)
            assert y.isfinite().all() and _err(y, ref) < TOL, (n, k, groups, m, c, _err(y, ref))


@pytest.mark.skipif(not torch.cuda.is_available() or not blockwise_scaled_mm_available(torch.device("cuda")),
                    reason="cuBLASLt's block-scaled GEMM needs SM90 and CUDA >= 12.9")
def test_scaled_mm_launch_matches_the_twin():
    q, s = _weights(8192, 4096, 3)
    for m in (1, 8, 33, 256):
        x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
        y = fp8_gemm(x, q, s, 1, Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False))
        assert y.shape == (m, 8192) and _err(y, fp8_gemm_torch(x, q, s)) < TOL


@pytest.mark.parametrize("kernel", ["triton", "wgmma", "wgmma_ws"])
@pytest.mark.parametrize("pdl", [False, True])
def test_split_k_deterministic_and_in_a_cuda_graph(kernel, pdl):
    # Under PDL the warp-specialized kernel requests its first weight tiles before the wait for x's quantize
    # launch: three chained GEMMs in one graph (each input the last one's output) check that x is still waited for
    q, s = _weights(1536, 4096, 4)
    q2, s2 = _weights(4096, 1536, 5)
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    c = Fp8GemmConfig(kernel, 16, 128, 8, 4, 4, kernel == "triton")
    c2 = c._replace(splits=3)

    def chain():
        return fp8_gemm(fp8_gemm(fp8_gemm(x, q, s, 1, c, pdl), q2, s2, 1, c2, pdl), q, s, 1, c, pdl)

    y0 = chain()
    assert all(torch.equal(y0, chain()) for _ in range(5))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = chain()
    graph.replay()
    assert torch.equal(y, y0)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(y, chain()) and not torch.equal(y, y0)
    z = fp8_gemm(fp8_gemm(x, q, s, 1, c), q2, s2, 1, c2)
    assert _err(y, fp8_gemm_torch(z, q, s)) < TOL


def test_backends_agree_and_torch_launches_no_triton():
    q, s = _weights(8192, 1024, 5)
    x = torch.randn(16, 1024, device="cuda").to(torch.bfloat16)
    yt = TritonBackend().fp8_linear(x, q, s, round_x=True)
    yc = TorchBackend().fp8_linear(x, q, s, round_x=True)
    assert _err(yt, yc) < TOL
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        TorchBackend().fp8_linear(x, q, s, round_x=True)
        TorchBackend().fp8_linear(x, q, s)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert not [n for n in names if any(k in n for k in ("_fp8_gemm_kernel", "_quantize_x_kernel", "_tile_kernel",
                                                          "_gemv_kernel"))], names


@pytest.mark.skipif(not torch.cuda.is_available() or not gluon_hopper(torch.device("cuda")),
                    reason="the Gluon kernels need a Hopper GPU")
def test_x_rounded_by_its_producer_gives_the_same_product_without_a_quantize_launch():
    # x as q_norm's launch leaves it (rms_norm_pair_rounded: the norm and its e4m3 rounding in one launch). Every
    # launch kind that rounds x by a quantize_x launch first reads the rounding instead: its product is bitwise the
    # one with that launch (the same codes and scales, the same kernel), and no quantize_x kernel runs.
    q, s = _weights(4096, 1024, 11)
    g = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(37, 1024, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(37, 512, device="cuda", generator=g).to(torch.bfloat16)
    wa, wb = torch.rand(1024, device="cuda", generator=g) + 0.5, torch.rand(512, device="cuda", generator=g) + 0.5
    x, _, rounded = rms_norm_pair_rounded(a, wa.bfloat16(), b, wb.bfloat16(), 1e-6)
    launches = [Fp8GemmConfig("wgmma_ws", 64, 64, 3, 4, 6, False, k_per_wait=2),
                Fp8GemmConfig("wgmma", 32, 64, 1, 4, 4, False, in_flight=1),
                Fp8GemmConfig("triton", 64, 64, 2, 4, 3, False)]
    if blockwise_scaled_mm_available(x.device):
        launches.append(Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False))
    for c in launches:
        assert takes_rounded_x(c, 1024), c
        y0 = fp8_gemm(x, q, s, 1, c)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y1 = fp8_gemm(x, q, s, 1, c, rounded=rounded)
            torch.cuda.synchronize()
        assert torch.equal(y0, y1), c
        assert not [e.name for e in prof.events() if "_quantize_x_kernel" in e.name], c
    assert not takes_rounded_x(Fp8GemmConfig("triton", 16, 64, 1, 4, 4, True), 1024)  # rounds x in its K loop
    assert not takes_rounded_x(Fp8GemmConfig("gemv", 1, 16, 1, 4, 3, True, 512), 1024)
    # the backend asks for it where the table's launch would quantize x: wq_b at 128 rows, not at one row
    rows = torch.empty(128, 1024, device="cuda", dtype=torch.bfloat16)
    assert TritonBackend().rounds_x_ahead(rows, [(32768, 1024)])
    assert not TritonBackend().rounds_x_ahead(rows[:1], [(32768, 1024)])


@pytest.mark.skipif(not torch.cuda.is_available() or not gluon_hopper(torch.device("cuda")),
                    reason="the table's Gluon launches need a Hopper GPU")
def test_flash_layers_read_x_and_qr_rounded_ahead_as_they_would_round_them():
    # Flash layers 2 (ratio 4: wq_b and the indexer's wq_b read qr) and 3 with FP8 weights and e4m3 activations
    # on the Triton backend, 128 rows: where the table's launch would quantize x or qr itself, the launch that
    # norms it rounds it too (x: add_rms_norm_rounded; qr: q_norm's, inside stage A). Every product is bitwise
    # the one of the layer that rounds by quantize_x launches, and those launches are fewer.
    cfg = load_config(ROOT / "configs" / "v4_flash.yaml", ["model.layers=2-3"])
    dev = torch.device("cuda")
    stack = AttentionStack(cfg.model, TPGroup(0, 1, dev), 256, torch.bfloat16, dev, backend=TritonBackend(),
                           fp8=True, round_x=True)
    init_seeded(stack, 0)
    g = torch.Generator(device="cuda").manual_seed(2)
    h, y = (torch.randn(128, cfg.model.hidden_size, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    for blk in stack.layers.values():
        layer = blk.attn
        assert layer.rounded_input_shapes() and layer.backend.rounds_x_ahead(h, layer.rounded_input_shapes())
        _, x, xr = layer.backend.add_rms_norm_rounded(h, y, blk.attn_norm.weight, blk.attn_norm.eps)

        def products(x_rounded, ahead):
            layer.backend = TritonBackend() if ahead else _NoRoundingAhead()
            a = layer.stage_a(x, x_rounded)
            q = layer.query(a.qr, a.qr_norm, a.qr_rounded)
            iq = layer.indexer.query(a.qr, a.qr_norm, a.qr_rounded) if layer.indexer is not None else None
            return a, [t for t in (*a[:7], q, iq) if t is not None]

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            a, fused = products(xr, True)
            torch.cuda.synchronize()
        fused_launches = sum("_quantize_x_kernel" in e.name for e in prof.events())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            b, apart = products(None, False)
            torch.cuda.synchronize()
        apart_launches = sum("_quantize_x_kernel" in e.name for e in prof.events())
        assert a.qr_rounded is not None and b.qr_rounded is None
        assert all(torch.equal(u, v) for u, v in zip(fused, apart))
        assert fused_launches < apart_launches, (fused_launches, apart_launches)


class _NoRoundingAhead(TritonBackend):
    """The Triton backend with every GEMM rounding its own x (a quantize_x launch where its launch needs one)."""

    def rounds_x_ahead(self, x: torch.Tensor, shapes: list[tuple[int, int]]) -> bool:
        return False
