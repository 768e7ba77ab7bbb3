"""The Triton RMSNorm and query/key head preparation (ops/rms_norm.py, ops/rope.py) against the torch path.

Run on a GPU machine: `pytest -m gpu tests/test_prep_kernels_gpu.py`. Where Triton is installed without
a GPU, `TRITON_INTERPRET=1 pytest -m gpu tests/test_prep_kernels_gpu.py` runs the same checks in fp32 on
the CPU through Triton's interpreter, on fewer and smaller cases (it checks indexing and masking, not the
compiled code).

Tolerances, per element: |got - ref| <= rtol * (|ref| + max |ref row|), a row being the last dim (a head).
- bf16 / fp16: rtol = eps of the dtype (2^-7 / 2^-10). Both paths round the same fp32 expressions at
  the same points (norm -> dtype, rotation in fp32 -> dtype); their fp32 values differ only by the order
  of the sum of squares and the rotation's fused multiply-adds, a few fp32 ulps (~2^-22 relative). So a
  result moves by one rounding step (<= eps |ref|) only where that difference straddles a rounding
  boundary (~2^-13 of the elements or fewer); where the normed input of a rotated pair flipped, the
  pair's outputs move by up to one step of that input, bounded by eps * max |row|. Hence also: at most
  1e-3 of the elements may differ at all. A wrong head, pair, angle or sign moves nearly every element
  it touches, by far more than one step.
- fp32: rtol = 64 eps (7.6e-6): the sums of 512..7168 squares in another order (~1e-6 relative), the
  approximate rsqrt (2 ulps) of both paths, and the rotation's cancellation (ac - bs near 0 carries the
  fp32 error of its terms, a few ulps of the row's magnitude).
"""

from __future__ import annotations


import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS
from conftest import TINY_PATH as TINY

from tp_runtime.config import ModelConfig, load_config
from tp_runtime.model.attention import DSV4Attention
from tp_runtime.model.rope import inv_frequencies
from tp_runtime.ops.select import KernelBackend
from tp_runtime.ops.torch_path import TorchBackend, apply_rotary, heads as twin_heads, rms_norm as torch_rms_norm
from tp_runtime.ops.triton_path import TritonBackend
from tp_runtime.parallel.group import TPGroup

triton = pytest.importorskip("triton")

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE

from tp_runtime.ops.rms_norm import rms_norm
from tp_runtime.ops.rope import prepare_heads

FLASH = ModelConfig()  # the released Flash dims are the defaults
EPS = FLASH.rms_norm_eps
# Triton's interpreter has no bf16 arithmetic of its own (numpy has no bf16): there, fp32 only.
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float32]
TOKENS = [1, 3] if INTERPRET else [1, 3, 512]
HEADS = [128, 64, 32, 16, 8]  # Pro at tp 1 / 2 / 4; Flash at tp 1 / 2 / 4 / 8
BIG_POS = 1_000_000  # far past any table the runs build: fp32 angles of large arguments


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def check_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """The module docstring's bound; for half types also the share of differing elements."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert not got.isnan().any()
    eps = torch.finfo(ref.dtype).eps
    rtol = 64 * eps if ref.dtype == torch.float32 else eps
    g, r = got.double(), ref.double()
    bad = (g - r).abs() > rtol * (r.abs() + r.abs().amax(-1, keepdim=True))
    assert not bad.any(), f"{int(bad.sum())} elements off, max |diff| {float((g - r).abs().max()):.3g}"
    if ref.dtype != torch.float32 and ref.numel():  # an empty result has no share (its mean is NaN)
        frac = float((g != r).double().mean())
        assert frac <= 1e-3, f"{frac:.2e} of the elements differ"


def cis_at(pos: torch.Tensor, dr: int = 64) -> torch.Tensor:
    """Rotary angles as RotaryTable builds them (compressed kind: YaRN), at arbitrary positions [T]."""
    f = inv_frequencies(dr, FLASH.compress_rope_theta, FLASH.rope_scaling)
    angles = pos.double().cpu()[:, None] * f[None]
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(DEV)


def positions(T: int, where: str) -> torch.Tensor:
    """T positions starting at 0 ('zero') or near BIG_POS ('big'); a batch of decodes when T is small."""
    base = 0 if where == "zero" else BIG_POS
    if T <= 3:
        return torch.tensor([base, base + 1, base + 127][:T], device=DEV)
    return torch.arange(base, base + T, device=DEV)


# ------------------------------------------------------------------ rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [7168, 4096, 1536, 1024, 512, 128])
def test_rms_norm_matches_torch(C, dtype):
    # Rows as stage A hands them: a column slice of a wider GEMM output (row stride > C), and contiguous.
    g = _gen(C)
    for T in TOKENS:
        wide = (torch.randn(T, C + 96, generator=g, device=DEV) * 3).to(dtype)
        w = (1 + 0.1 * torch.randn(C, generator=g, device=DEV)).to(dtype)
        for x in (wide[:, 32:32 + C], wide[:, :C].contiguous()):
            for weight in (w, None):
                y = rms_norm(x, weight, EPS)
                assert y.is_contiguous()
                check_close(y, torch_rms_norm(x, weight, EPS))


def test_rms_norm_no_rows_and_a_tiny_row():
    x = torch.randn(0, 64, device=DEV)
    assert rms_norm(x, None, EPS).shape == (0, 64)
    x = torch.randn(5, 32, device=DEV)  # tiny.yaml's head_dim; hidden 64
    check_close(rms_norm(x, torch.ones(32, device=DEV), EPS), torch_rms_norm(x, torch.ones(32, device=DEV), EPS))


# ------------------------------------------------------------------ prepare_heads


def heads_case(T, n_heads, dtype, seed, pos, D=512, Ih=64, Id=128, dr=64, cis=None):
    g = _gen(seed)
    q = (torch.randn(T, n_heads, D, generator=g, device=DEV) * 2).to(dtype)
    kv = torch.randn(T, D, generator=g, device=DEV).to(dtype)
    idx_q = (torch.randn(T, Ih, Id, generator=g, device=DEV) * 4).to(dtype)
    return q, kv, idx_q, cis_at(pos, dr) if cis is None else cis


def torch_heads(q, kv, idx_q, cis, kv_dtype):
    """The torch backend's heads (ops/torch_path.py)."""
    return twin_heads(q, kv, cis, EPS, kv_dtype, idx_q)


def run_heads(q, kv, idx_q, cis, kv_dtype):
    q, idx_q = q.clone(), None if idx_q is None else idx_q.clone()  # overwritten in place
    kv_out = torch.full(kv.shape, float("nan"), dtype=kv_dtype, device=DEV)
    prepare_heads(q, kv, kv_out, cis, EPS, idx_q)
    return q, kv_out, idx_q


def check_heads(q, kv, idx_q, cis, kv_dtype=None):
    kv_dtype = kv_dtype or kv.dtype
    got, ref = run_heads(q, kv, idx_q, cis, kv_dtype), torch_heads(q, kv, idx_q, cis, kv_dtype)
    for a, b in zip(got, ref):
        if b is None:
            assert a is None
        else:
            check_close(a, b)


@pytest.mark.parametrize("where", ["zero", "big"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads", HEADS)
def test_prepare_heads_matches_torch(n_heads, dtype, where):
    # A ratio-4 layer: q, kv and the indexer query in one launch.
    for T in TOKENS:
        check_heads(*heads_case(T, n_heads, dtype, seed=T, pos=positions(T, where)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prepare_heads_window_layer_and_position_zero_is_identity(dtype):
    # Window-only layers have no indexer; at position 0 the rotation is the identity, so q is the norm alone.
    q, kv, _, cis = heads_case(3, 64, dtype, seed=5, pos=torch.zeros(3, dtype=torch.long, device=DEV))
    check_heads(q, kv, None, cis)
    got_q, got_kv, _ = run_heads(q, kv, None, cis, kv.dtype)
    assert torch.equal(got_kv, kv)
    check_close(got_q, torch_rms_norm(q, None, EPS))


def test_prepare_heads_arbitrary_cis_and_a_cache_dtype():
    # cis need not be unit numbers; kv rounds to its own dtype, then to the cache's, as the torch path does.
    g = _gen(6)
    cis = torch.complex(torch.randn(3, 32, generator=g, device=DEV), torch.randn(3, 32, generator=g, device=DEV))
    check_heads(*heads_case(3, 16, torch.float32, seed=6, pos=None, cis=cis))
    if not INTERPRET:
        q, kv, idx_q, cis = heads_case(3, 32, torch.float16, seed=7, pos=positions(3, "big"))
        check_heads(q, kv, idx_q, cis)
        check_heads(q, kv, idx_q, cis, kv_dtype=torch.bfloat16)
        check_heads(q.float(), kv.float(), idx_q.float(), cis, kv_dtype=torch.bfloat16)


def test_prepare_heads_tiny_dims():
    # tiny.yaml: D = 32 (Dr = 8), 4 local heads, 8 indexer heads of 16 dims; and no tokens.
    check_heads(*heads_case(5, 4, torch.float32, seed=8, pos=positions(3, "big").repeat(2)[:5], D=32, Ih=8, Id=16,
                            dr=8))
    q, kv, idx_q, cis = heads_case(0, 8, torch.float32, seed=9, pos=torch.zeros(0, dtype=torch.long, device=DEV))
    run_heads(q, kv, idx_q, cis, kv.dtype)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prepare_heads_stores_the_kv_rows_into_the_ring(dtype, fp8):
    # A decode step's heads launch also stores each token's kv row at its write row (the static decode path's
    # ring write): exactly the bytes of kv_out there (bf16 rows or FP8 row bytes), as the torch twin does,
    # and no other row of the ring touched. Tokens 0..T-3 have slots of their own; the last two
    # are padding, whose rows both land in the trash slot's row 0 (two programs store it at once: each element
    # holds one of the two rows' values).
    from tp_runtime.model.step_index import ring_index
    from tp_runtime.ops.cache_fp8 import row_bytes

    T, W, D, slots = (5 if INTERPRET else 64), 8, 512, (5 if INTERPRET else 64)
    pos = torch.cat([torch.arange(3, 3 + T - 2, device=DEV) * 37, torch.zeros(2, dtype=torch.long, device=DEV)])
    slot = torch.cat([torch.arange(T - 2, device=DEV), torch.full((2,), slots, device=DEV)])
    ix = ring_index(W, slot, pos, torch.arange(T, device=DEV), pos, pos, slots)
    q, kv, idx_q, cis = heads_case(T, 16, dtype, seed=11, pos=pos)
    kv_dtype = torch.uint8 if fp8 else dtype
    width = row_bytes(D, 64) if fp8 else D
    g = _gen(12)
    window = (torch.randint(0, 255, (slots + 1, W, width), generator=g, device=DEV, dtype=torch.uint8) if fp8
              else torch.randn(slots + 1, W, D, generator=g, device=DEV).to(dtype))
    ring, twin_ring = window.clone(), window.clone()
    kv_out = torch.empty(T, width, dtype=kv_dtype, device=DEV)
    prepare_heads(q.clone(), kv, kv_out, cis, EPS, idx_q.clone(), (ring, ix.write_row))
    _, twin_kv, _ = twin_heads(q, kv, cis, EPS, kv_dtype, idx_q, (twin_ring, ix))
    rows, real = ring.view(-1, width), ix.write_row[: T - 2]
    assert torch.equal(rows[real], kv_out[: T - 2])
    trash = rows[ix.write_row[-1]]
    assert ((trash == kv_out[-1]) | (trash == kv_out[-2])).all()
    untouched = torch.ones(rows.shape[0], dtype=torch.bool, device=DEV)
    untouched[ix.write_row] = False
    assert torch.equal(rows[untouched], window.view(-1, width)[untouched])
    twin_rows = twin_ring.view(-1, width)  # the twin stores its own kv rows the same way (its values are
    assert torch.equal(twin_rows[real], twin_kv[: T - 2])  # checked against the kernel's in the tests above)
    assert torch.equal(twin_rows[untouched], window.view(-1, width)[untouched])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Ih,Id,dr", [(1, 64, 128, 64), (3, 8, 16, 8)] + ([] if INTERPRET else [(512, 64, 128, 64)]))
def test_rotary_alone_matches_torch(T, Ih, Id, dr, dtype):
    # The Triton backend's rotary (the indexer query on the side stream): prepare_heads with no query heads
    # ropes x in place, and equals the torch twin; the same values as x riding along in the heads launch.
    q, kv, idx_q, cis = heads_case(T, 4, dtype, seed=T + Id, pos=positions(T, "big"), Ih=Ih, Id=Id, dr=dr)
    x = idx_q.clone()
    got = TritonBackend().rotary(x, cis)
    assert got is x  # in place
    check_close(got, apply_rotary(idx_q, cis))
    _, _, fused = run_heads(q, kv, idx_q, cis, kv.dtype)
    assert torch.equal(got, fused)


# ------------------------------------------------------------------ the layer's wiring


def _layer(cfg: ModelConfig, ratio: int, tp: int, dtype: torch.dtype, backend: KernelBackend,
           seed: int) -> DSV4Attention:
    layer = DSV4Attention(cfg, ratio, TPGroup(rank=0, size=tp, device=DEV), dtype, DEV, backend)
    g = _gen(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, device=DEV))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g, device=DEV) * p.shape[1] ** -0.5)
    return layer


LAYER_CASES = [("tiny", 4, 2), ("tiny", 0, 2)] + ([] if INTERPRET else [("flash", 4, 8), ("flash", 0, 1)])


@pytest.mark.parametrize("dims,ratio,tp", LAYER_CASES)
def test_layer_stage_a_and_heads_match_the_torch_path(dims, ratio, tp):
    # The same weights built for both backends: stage A's norms and the heads of stage B agree.
    cfg = load_config(TINY).model if dims == "tiny" else FLASH
    dtype = torch.float32 if INTERPRET or dims == "tiny" else torch.bfloat16
    ref_layer, layer = (_layer(cfg, ratio, tp, dtype, b, seed=ratio) for b in (TorchBackend(), TritonBackend()))
    x = torch.randn(7, cfg.hidden_size, generator=_gen(1), device=DEV).to(dtype)
    a, ra = layer.stage_a(x), ref_layer.stage_a(x)
    check_close(a.qr, ra.qr)
    check_close(a.kv, ra.kv)
    cis = cis_at(positions(7, "big"), cfg.qk_rope_head_dim)

    def heads(m: DSV4Attention):
        return m.backend.heads(m.query(ra.qr), ra.kv, cis, m.eps, dtype, m.indexer.query(ra.qr) if m.indexer else None)

    got, ref = heads(layer), heads(ref_layer)
    assert (got[2] is None) == (ratio != 4)
    for g, r in zip(got, ref):
        if r is not None:
            check_close(g, r)


# ------------------------------------------------------------------ capture


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("T", [1, 8])
def test_norm_and_heads_replay_in_a_cuda_graph(T):
    # Captured once, replayed after every input changed (rows, positions): the replay equals the torch path.
    dtype = torch.bfloat16
    x = torch.randn(T, 4096, device=DEV).to(dtype)
    w = (1 + 0.1 * torch.randn(4096, device=DEV)).to(dtype)
    q, kv, idx_q, cis = heads_case(T, 64, dtype, seed=11, pos=positions(T, "zero"))
    kv_out = torch.empty_like(kv)
    rms_norm(x, w, EPS)  # compile outside the capture
    prepare_heads(q.clone(), kv, kv_out, cis, EPS, idx_q.clone())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = rms_norm(x, w, EPS)
        prepare_heads(q, kv, kv_out, cis, EPS, idx_q)
    qb, kvb, iqb, cisb = heads_case(T, 64, dtype, seed=12, pos=positions(T, "big"))
    xb = torch.randn(T, 4096, device=DEV).to(dtype)
    for dst, src in ((x, xb), (q, qb), (kv, kvb), (idx_q, iqb), (cis, cisb)):
        dst.copy_(src)
    g.replay()
    check_close(y, torch_rms_norm(xb, w, EPS))
    for got, ref in zip((q, kv_out, idx_q), torch_heads(qb, kvb, iqb, cisb, dtype)):
        check_close(got, ref)


@pytest.mark.skipif(INTERPRET, reason="runtime.kernels=triton needs a CUDA device")
def test_tiny_run_with_triton_kernels_matches_torch():
    # The whole tiny stack (fp32) with every Triton kernel against runtime.kernels=torch.
    from tp_runtime.engine.entry import in_process
    from tp_runtime.verify.check import TOLERANCES, max_rel_err

    base = ["parallel.tp=1", "runtime.device=cuda", "graph.mode=eager", "workload.requests=4"]
    tri = in_process(load_config(TINY, base + ["runtime.kernels=triton"]), keep_outputs=True)
    ref = in_process(load_config(TINY, base + ["runtime.kernels=torch"]), keep_outputs=True)
    assert tri.kernels == "triton" and ref.kernels == "torch"
    assert max_rel_err(tri.outputs, ref.outputs) <= TOLERANCES["float32"]
