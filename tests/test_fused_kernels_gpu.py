"""The fused launches against their torch twins (ops/torch_path.py) and the unfused Triton kernels, at edge
cases: ops/add_rms_norm.py (residual add + the next attn_norm), ops/rms_norm_pair.py (q_norm + kv_norm),
ops/gemv.py (skinny GEMM, optionally behind an RMSNorm of x).

Run on a GPU machine: `pytest -m gpu tests/test_fused_kernels_gpu.py`. Where Triton is installed without a
GPU, `TRITON_INTERPRET=1 pytest -m gpu tests/test_fused_kernels_gpu.py` runs the same checks in fp32 on
small dims through Triton's interpreter (indexing, masking, split-K bookkeeping; not the compiled code).

What is asserted, and why:
- add_rms_norm: h_new bitwise equal to torch's `h + y` (the same fp32 sum, one rounding); x bitwise equal
  to ops/rms_norm.py's kernel on that h_new (the same expression, tile, warp count and, for the rows used
  here, alignment class); x against the torch RMSNorm to the RMSNorm kernel's tolerance (`check_close`,
  tests/test_prep_kernels_gpu.py: one rounding step where the fp32 sum of squares in another order straddles
  a rounding boundary). With x rounded to e4m3 in the same launch (add_rms_norm_rounded): h_new and x bitwise
  add_rms_norm's, the rounding bitwise quantize_x's twin on x.
- rms_norm_pair: each output bitwise equal to ops/rms_norm.py's kernel on its input; against the torch
  twin as above. With ya rounded to e4m3 in the same launch (rms_norm_pair_rounded): the norms bitwise the
  pair's, the rounding bitwise quantize_x's twin on ya (the same function of the same stored values).
- gemv: relative error of y in fp32 norm, ||y - ref|| / ||ref||, against F.linear of the same inputs
  (the twin): bf16 8e-3, fp32 1e-5. bf16: both round y once from fp32 sums in different orders (and cuBLAS
  may reduce split-K partials in bf16), and with the norm the twin rounds the normed x to bf16 where the
  kernel rounds x * g (dot kernel) or nothing (fma kernel): ~1.6e-3 expected, so 8e-3 is 5x margin, while a
  wrong tile, mask, split or row scale moves y by O(1). fp32: only the summation order and the place of
  the row scale (fp32 sums of up to 8192 terms: ~2e-6). Without the norm also against the float64 product
  of the same inputs: within one output rounding for bf16 (2^-9 relative per element, so in norm), 1e-5
  for fp32. Split-K sums in a fixed order: repeated calls, a CUDA-graph replay and PDL on / off give
  bitwise equal outputs.
"""

from __future__ import annotations

import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS
from test_prep_kernels_gpu import check_close

from tp_runtime.ops import torch_path

triton = pytest.importorskip("triton")

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE

from tp_runtime.ops.act_quant import ROUNDED_ROWS, quantize_x_torch
from tp_runtime.ops.add_rms_norm import add_rms_norm, add_rms_norm_rounded
from tp_runtime.ops.gemv import GemvConfig, gemv, gemv_config, use_triton_gemv
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.ops.rms_norm import rms_norm
from tp_runtime.ops.rms_norm_pair import rms_norm_pair, rms_norm_pair_rounded

EPS = 1e-6
# Triton's interpreter has no bf16 arithmetic of its own (numpy has none): there, fp32 only.
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float32]
ROWS = [0, 1, 3] if INTERPRET else [0, 1, 3, 16, 512]
GPU_ONLY = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="compiled kernels on a CUDA GPU")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def rows(T: int, C: int, dtype: torch.dtype, g: torch.Generator, strided: bool, scale: float = 1.0) -> torch.Tensor:
    """[T, C] random rows: contiguous, or a column slice of a wider tensor (row stride C + 96, offset 32)."""
    wide = torch.randn(T, C + 96 if strided else C, generator=g, device=DEV) * scale
    return (wide[:, 32:32 + C] if strided else wide).to(dtype)


def norm_weight(C: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (1 + 0.1 * torch.randn(C, generator=g, device=DEV)).to(dtype)


# ------------------------------------------------------------------ add_rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [64, 100] if INTERPRET else [7168, 4096, 100])
def test_add_rms_norm_matches_the_unfused_composition(C, dtype):
    g = _gen(C)
    w = norm_weight(C, dtype, g)
    for T in ROWS:
        for strided in (False, True):
            h, y = rows(T, C, dtype, g, strided, 3.0), rows(T, C, dtype, g, not strided)
            h_new, x = add_rms_norm(h, y, w, EPS)
            ref_h, ref_x = torch_path.add_rms_norm(h, y, w, EPS)
            assert h_new.is_contiguous() and x.is_contiguous() and x.shape == (T, C)
            assert torch.equal(h_new, ref_h)
            assert torch.equal(x, rms_norm(ref_h, w, EPS))
            check_close(x, ref_x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [128, 200] if INTERPRET else [4096, 7168, 200])
def test_add_rms_norm_rounded_is_add_rms_norm_then_quantize_x(C, dtype):
    # h_new and x bitwise add_rms_norm's (also in place, h_out = h); x's rounding bitwise quantize_x's twin on x,
    # padded to ROUNDED_ROWS rows as quantize_x pads (a zero row).
    g = _gen(C + 5)
    w = norm_weight(C, dtype, g)
    for T in ROWS + [17]:
        h, y = rows(T, C, dtype, g, True, 3.0), rows(T, C, dtype, g, False)
        ref_h, ref_x = add_rms_norm(h, y, w, EPS)
        h_new, x, rx = add_rms_norm_rounded(h, y, w, EPS, h_out=h)
        assert h_new.data_ptr() == h.data_ptr() and torch.equal(h_new, ref_h) and torch.equal(x, ref_x)
        check_rounded_as_quantize_x(rx, x)


def check_rounded_as_quantize_x(r, y: torch.Tensor) -> None:
    """r (a RoundedX of y [T, C]) is quantize_x's twin on y padded to ROUNDED_ROWS zero rows (codes 0, the floor's
    scale), scales column-major: bitwise, but the codes only on a GPU (the interpreter's fp32 -> e4m3 cast drops the
    carry into the next binade: 31.1 -> 16)."""
    T, C = y.shape
    mp = -(-T // ROUNDED_ROWS) * ROUNDED_ROWS
    assert r.q.shape == (mp, C) and r.s.shape == (mp, -(-C // 128)) and (mp == 0 or r.s.stride() == (1, mp))
    q, sc = quantize_x_torch(torch.cat([y, y.new_zeros(mp - T, C)]))
    assert torch.equal(r.s, sc)
    if not INTERPRET:
        assert torch.equal(r.q.view(torch.uint8), q.view(torch.uint8))


def test_add_rms_norm_rounded_refuses_rows_under_one_block():
    h = torch.randn(3, 64, device=DEV)
    with pytest.raises(ValueError, match="128-wide"):
        add_rms_norm_rounded(h, h.clone(), torch.ones(64, device=DEV), EPS)


def test_add_rms_norm_in_place_and_bad_input():
    g = _gen(1)
    h, y = rows(3, 48, torch.float32, g, False), rows(3, 48, torch.float32, g, True)
    w = norm_weight(48, torch.float32, g)
    ref_h, ref_x = torch_path.add_rms_norm(h, y, w, EPS)
    h_new, x = add_rms_norm(h, y, w, EPS, h_out=h)
    assert h_new.data_ptr() == h.data_ptr() and torch.equal(h, ref_h)
    check_close(x, ref_x)
    with pytest.raises(ValueError, match="add_rms_norm"):
        add_rms_norm(h, y.double(), w, EPS)


@GPU_ONLY
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_pdl_is_bitwise_the_same(dtype):
    g = _gen(2)
    h, y, w = rows(4, 4096, dtype, g, False), rows(4, 4096, dtype, g, False), norm_weight(4096, dtype, g)
    a, b = add_rms_norm(h, y, w, EPS), add_rms_norm(h, y, w, EPS, pdl=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------ rms_norm_pair


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ca,cb", [(64, 32), (100, 36)] if INTERPRET else [(1024, 512), (1536, 512), (100, 36)])
def test_rms_norm_pair_is_two_rms_norms(ca, cb, dtype):
    # As stage A hands them: column slices of one GEMM output [T, Ca + Cb + more], and contiguous rows.
    g = _gen(ca + cb)
    wa, wb = norm_weight(ca, dtype, g), norm_weight(cb, dtype, g)
    for T in ROWS:
        out = (torch.randn(T, ca + cb + 40, generator=g, device=DEV) * 2).to(dtype)
        for a, b in ((out[:, :ca], out[:, ca:ca + cb]), (out[:, :ca].contiguous(), out[:, ca:ca + cb].contiguous())):
            ya, yb = rms_norm_pair(a, wa, b, wb, EPS)
            assert ya.is_contiguous() and yb.is_contiguous() and ya.shape == (T, ca) and yb.shape == (T, cb)
            assert torch.equal(ya, rms_norm(a, wa, EPS)) and torch.equal(yb, rms_norm(b, wb, EPS))
            ra, rb = torch_path.rms_norm_pair(a, wa, b, wb, EPS)
            check_close(ya, ra)
            check_close(yb, rb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ca,cb", [(128, 32), (200, 36)] if INTERPRET else [(1024, 512), (1536, 512), (200, 36)])
def test_rms_norm_pair_rounded_is_the_pair_then_quantize_x(ca, cb, dtype):
    # ya and yb bitwise rms_norm_pair's; ya's rounding bitwise quantize_x's twin on ya (the same rounding of the
    # same stored values), padded to ROUNDED_ROWS rows as quantize_x pads (a zero row: codes 0, the floor's scale).
    g = _gen(ca + 3 * cb)
    wa, wb = norm_weight(ca, dtype, g), norm_weight(cb, dtype, g)
    for T in ROWS + [17]:
        out = (torch.randn(T, ca + cb + 40, generator=g, device=DEV) * 2).to(dtype)
        a, b = out[:, :ca], out[:, ca:ca + cb]
        ya, yb, ra = rms_norm_pair_rounded(a, wa, b, wb, EPS)
        pa, pb = rms_norm_pair(a, wa, b, wb, EPS)
        assert torch.equal(ya, pa) and torch.equal(yb, pb)
        check_rounded_as_quantize_x(ra, ya)


def test_rms_norm_pair_rounded_refuses_rows_under_one_block():
    a, b = torch.randn(3, 64, device=DEV), torch.randn(3, 32, device=DEV)
    with pytest.raises(ValueError, match="128-wide"):
        rms_norm_pair_rounded(a, torch.ones(64, device=DEV), b, torch.ones(32, device=DEV), EPS)


def test_rms_norm_pair_refuses_mismatched_rows():
    a, b = torch.randn(3, 64, device=DEV), torch.randn(2, 32, device=DEV)
    with pytest.raises(ValueError, match="rows"):
        rms_norm_pair(a, torch.ones(64, device=DEV), b, torch.ones(32, device=DEV), EPS)
    with pytest.raises(ValueError, match="weight"):
        rms_norm_pair(a, torch.ones(63, device=DEV), b[:1].expand(3, 32), torch.ones(32, device=DEV), EPS)


@GPU_ONLY
def test_rms_norm_pair_pdl_is_bitwise_the_same():
    g = _gen(3)
    a, b = rows(2, 1024, torch.bfloat16, g, True), rows(2, 512, torch.bfloat16, g, True)
    wa, wb = norm_weight(1024, torch.bfloat16, g), norm_weight(512, torch.bfloat16, g)
    ya, yb = rms_norm_pair(a, wa, b, wb, EPS)
    pa, pb = rms_norm_pair(a, wa, b, wb, EPS, pdl=True)
    assert torch.equal(ya, pa) and torch.equal(yb, pb)


# ------------------------------------------------------------------ gemv

TOL = {torch.bfloat16: 8e-3, torch.float32: 1e-5}
TOL_F64 = {torch.bfloat16: 2.0 ** -9, torch.float32: 1e-5}


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def gemv_case(M: int, N: int, K: int, dtype: torch.dtype, seed: int, strided: bool = False):
    g = _gen(seed)
    x = rows(M, K, dtype, g, strided, 2.0)
    w = (torch.randn(N, K, generator=g, device=DEV) * K ** -0.5).to(dtype)
    return x, w, norm_weight(K, dtype, g)


def check_gemv(x, w, gw, config: GemvConfig | None = None) -> torch.Tensor:
    """gemv against its twin (and, without the norm, the float64 product) at the module's tolerances."""
    y = gemv(x, w, gw, EPS, config=config)
    assert y.shape == (x.shape[0], w.shape[0]) and y.dtype == x.dtype and y.is_contiguous()
    assert y.isfinite().all()
    ref = torch_path.gemv(x, w, gw, EPS)
    err = rel_err(y, ref)
    assert err <= TOL[x.dtype], (tuple(x.shape), tuple(w.shape), gw is not None, config, err)
    if gw is None:
        err64 = rel_err(y, x.double() @ w.double().T)
        assert err64 <= TOL_F64[x.dtype], (tuple(x.shape), tuple(w.shape), config, err64)
    return y


# K = 200 is no multiple of any K step, N = 40 of no row block; the forced configurations split K three ways
# over 4 (fma: 64-column) or 7 (dot: 32-column) steps, so that the last split of the fma case has no step.
SMALL_CONFIGS = [None, GemvConfig(False, 1, 16, 64, 4, 1, 3), GemvConfig(True, 16, 32, 32, 4, 1, 3)]


@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=["table", "fma-split", "dot-split"])
@pytest.mark.parametrize("M", [1, 3, 16])
def test_gemv_small_shapes(M, config):
    for dtype in DTYPES:
        x, w, gw = gemv_case(M, 40, 200, dtype, seed=M, strided=True)
        for norm in (None, gw):
            y = check_gemv(x, w, norm, config)
            assert torch.equal(y, gemv(x.contiguous(), w, norm, EPS, config=config))  # strides change nothing


def test_gemv_no_rows_bad_input_and_own_counters():
    x, w, gw = gemv_case(0, 40, 200, torch.float32, seed=4)
    assert gemv(x, w, gw, EPS).shape == (0, 40)
    x, w, gw = gemv_case(2, 40, 200, torch.float32, seed=5)
    cnt = torch.zeros(64, dtype=torch.int32, device=DEV)
    y = gemv(x, w, gw, EPS, config=SMALL_CONFIGS[2], counters=cnt)
    assert torch.equal(y, gemv(x, w, gw, EPS, config=SMALL_CONFIGS[2])) and not cnt.any()  # counters reset
    with pytest.raises(ValueError, match="gemv"):
        gemv(x, w[:, :100], None)
    with pytest.raises(ValueError, match="gemv"):
        gemv(x, w.double(), None)


def test_use_triton_gemv_reads_one_table(monkeypatch):
    from tp_runtime.ops import gemv as gemv_module
    monkeypatch.setattr(gemv_module, "TRITON_GEMV_MAX_M", {(4096, 1024): 8})
    monkeypatch.setattr(gemv_module, "TRITON_GEMV_NORM_MAX_M", {(8192, 1024): 2})
    assert use_triton_gemv(8, 4096, 1024) and not use_triton_gemv(9, 4096, 1024)
    assert not use_triton_gemv(1, 4096, 4096) and not use_triton_gemv(1, 4096, 1024, norm=True)
    assert use_triton_gemv(2, 8192, 1024, norm=True) and not use_triton_gemv(2, 8192, 1024)
    assert not use_triton_gemv(0, 4096, 1024)


def decode_shapes() -> list[tuple[int, int, bool]]:
    """(N, K, norm) of Flash's decode GEMMs this kernel is for, at tp 1 and 8: wx (ratio 0 / 128 / 4, with
    attn_norm), wq_b (with q_norm), the indexer's wq_b, wo_b; and one of Pro's (hidden 7168)."""
    return [(1536, 4096, True), (2560, 4096, True), (4160, 4096, True), (32768, 1024, True), (4096, 1024, True),
            (8192, 1024, True), (4096, 8192, False), (4096, 1024, False), (1536 + 512, 7168, True)]


@GPU_ONLY
@pytest.mark.parametrize("n,k,norm", decode_shapes())
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_decode_shapes(n, k, norm, dtype):
    for M in (1, 2, 5, 16, 32):
        x, w, gw = gemv_case(M, n, k, dtype, seed=n + M, strided=M == 5)
        check_gemv(x, w, gw if norm else None)
        check_gemv(x, w, None)


@GPU_ONLY
@pytest.mark.parametrize("M", [1, 16])
def test_gemv_deterministic_in_a_cuda_graph_and_with_pdl(M):
    x, w, gw = gemv_case(M, 4160, 4096, torch.bfloat16, seed=9)
    assert gemv_config(M, 4160, 4096, sm_count(x.device)).splits > 1  # the split-K path is what is tested
    eager = [gemv(x, w, gw, EPS), gemv(x, w, None)]
    assert torch.equal(eager[0], gemv(x, w, gw, EPS)) and torch.equal(eager[0], gemv(x, w, gw, EPS, pdl=True))
    assert torch.equal(eager[1], gemv(x, w, None, pdl=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = [gemv(x, w, gw, EPS, pdl=True), gemv(x, w, None, pdl=True)]
    graph.replay()
    assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out[0], gemv(x, w, gw, EPS)) and not torch.equal(out[0], eager[0])
