"""The Triton kernels with FP8 caches (runtime.cache_format=fp8) against the torch path, on random inputs.

Run on a GPU machine: `pytest -m gpu tests/test_fp8_cache_gpu.py`. Where Triton is installed without a GPU,
`TRITON_INTERPRET=1 pytest -m gpu tests/test_fp8_cache_gpu.py` runs the same checks (fp32, smaller cases)
on the CPU through Triton's interpreter: indexing, masking and the bit operations, not the compiled code.

Checked:
- the kernels' quantize / dequantize helpers (ops/cache_fp8.py) against torch's, bit for bit, on the same
  fp32 inputs: zeros, e4m3's max, ties, subnormals, power-of-two edges of the block scale, bf16 ties;
- sparse attention and indexer scores reading FP8 rows / keys (e4m3 codes and their scales) in place, every
  edge case of tests/test_kernels_gpu.py (contexts at the window and block edges, prefill chunks, forced splits,
  small dims, exact top-K ties). Both paths read the same bytes and dequantize exactly, so the tolerances of
  test_kernels_gpu.py apply unchanged and top-K sets on integer inputs must be identical;
- the kv row of prepare_heads and the compressors' entries and keys quantized in the kernels. The two
  paths quantize fp32 values that differ by summation order and rotation rounding (~1e-6 relative): the
  bytes are the same but where such a value sits within that distance of an e4m3 rounding midpoint. So
  at most 1e-3 of the bytes may differ, and each dequantized row within 1e-2 relative of the torch path's
  (one e4m3 step of one element moves a 64+ dim row by at most 2^-3 / 8 ~ 1.6e-2 of the element's
  share, ~1e-3 typically; a wrong scale or layout moves rows by 1e-1 and more);
- a CUDA-graph replay of attention and top-K over FP8 caches (GPU only);
- runtime.indexer_q=e4m3 over FP8 keys: the query rounding (`quantize_vectors`) against quantize_keys bit for
  bit, and the score kernel's FP8 dot (e4m3 q codes times the stored key codes) against the torch path, which
  rounds q with round_keys and scores in fp32. Each product of two e4m3 values is exact in fp32, so the two
  differ only in how the Id products of a (head, key) dot are summed: in another order and, on Hopper, in
  the FP8 MMA's accumulator, narrower than fp32 (about 14 bits: DeepSeek-V3's report). Even if each of the
  128 additions lost 2^-13 of the sum of the magnitudes so far, a dot would be off by at most 2^-6 of
  sum_d |q_d k_d|, a worst case that needs every loss in one direction; over terms of random sign they
  mostly cancel. So each score may differ from the exact one by FP8_DOT_TOL = 2^-7 of its size, scale *
  sum_h |w_h| * sum_d |q_hd k_d| (relu moves nothing by more than its input; the fp32 head sums add ~2^-18).
  A key scored with another key's scale or a head without its scale is off by 100 % and more; the rounding
  itself is checked bit for bit (and, with keys in q's dtype, to 1e-5 in tests/test_kernels_gpu.py). Picks
  may differ only between scores within twice that bound of the K-th; with integer inputs (q in -2..2, keys
  in -1..1: codes 128 or 256 times a power of two, partial sums multiples of 2^15 below 2^23, 9 significant
  bits) every dot is exact on any accumulator of 10 bits or more, so the sets must be identical, ties too.
  The interpreter runs the FP8 dot on the decoded values with fp32 sums.
"""

from __future__ import annotations

import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS

from tp_runtime.ops.torch_path import heads as torch_heads
from tp_runtime.ops import torch_path
from tp_runtime.ops.cache_fp8 import (dequantize_keys, dequantize_rows, quantize_keys, quantize_rows, round_keys,
                                      row_bytes)

triton = pytest.importorskip("triton")
tl = triton.language

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE

from test_compressor_kernel_gpu import Case, step_batch  # noqa: E402
from test_kernels_gpu import (  # noqa: E402
    DECODE_POS, DTYPES, FLASH, TOL, _config, assert_graph_replay_follows_inputs, attention_case, padded_picks_case,
    rel_err, run_both, topk_case)

from tp_runtime.ops.cache_fp8 import load_keys, load_rows, quantize_vectors, store_key, store_row  # noqa: E402
from tp_runtime.ops.indexer_topk import SELECTS, indexer_scores, indexer_topk  # noqa: E402
from tp_runtime.ops.rope import prepare_heads  # noqa: E402
from tp_runtime.ops.sparse_attention import AttnConfig  # noqa: E402

EPS = 1e-6
BYTES_DIFFER = 1e-3  # share of bytes two quantizations of near-equal fp32 values may differ in (docstring)
ROW_TOL = 1e-2
FP8_DOT_TOL = 2.0 ** -7  # of a score's absolute size, for the FP8 dot (module docstring)


# ------------------------------------------------------------------ the helpers, bit for bit


@triton.jit
def _store_rows_kernel(x_ptr, b_ptr, D: tl.constexpr, DR: tl.constexpr, BLOCK_D: tl.constexpr, NB: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    store_row(b_ptr + r * NB, tl.load(x_ptr + r * D + d, mask=d < D, other=0.0), D - DR, DR, BLOCK_D, NB)


@triton.jit
def _load_rows_kernel(b_ptr, y_ptr, n, D: tl.constexpr, DR: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, NB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    ok = rows < n
    y = load_rows(b_ptr + rows * NB, d, ok, D - DR, DR, tl.float32)
    tl.store(y_ptr + rows[:, None] * D + d[None, :], y, mask=ok[:, None] & (d < D)[None, :])


@triton.jit
def _store_keys_kernel(x_ptr, c_ptr, s_ptr, ID: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    store_key(c_ptr + r * ID, s_ptr + r, tl.load(x_ptr + r * ID + d, mask=d < ID, other=0.0), ID, BLOCK_D)


@triton.jit
def _load_keys_kernel(c_ptr, s_ptr, y_ptr, n, ID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    ok = rows < n
    y = load_keys(c_ptr + tl.multiple_of(rows * ID, 16), s_ptr + rows, d, ok, ID)  # Id: a multiple of 16
    tl.store(y_ptr + rows[:, None] * ID + d[None, :], y, mask=ok[:, None] & (d < ID)[None, :])


@triton.jit
def _quantize_vectors_kernel(x_ptr, c_ptr, k_ptr, M: tl.constexpr, ID: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.arange(0, M)
    d = tl.arange(0, BLOCK_D)
    m = (d < ID)[None, :]
    codes, k = quantize_vectors(tl.load(x_ptr + r[:, None] * ID + d[None, :], mask=m, other=0.0))
    tl.store(c_ptr + r[:, None] * ID + d[None, :], codes.to(tl.uint8, bitcast=True), mask=m)
    tl.store(k_ptr + r, k)


def edge_rows(n: int, D: int, seed: int) -> torch.Tensor:
    """[n, D] fp32 rows over 30 orders of magnitude, the first rows the edge cases of the rounding."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, D, generator=g, device=DEV) * torch.logspace(-15, 15, n, device=DEV)[:, None]
    steps = torch.tensor([1.0, 1 + 1 / 16, 1 + 3 / 16, 1.5, 1.75, 2 + 1 / 8, 2.0 ** -9 * 1.5, 2.0 ** -9 * 0.5,
                          2.0 ** -9 * 0.49, 2.0 ** -7 * 1.0625, -0.0, 240.0, 447.0, 416.0, 432.0, 1e-40],
                         device=DEV)
    x[0] = 0.0  # a zero row
    x[1, :] = 448.0  # e4m3's max everywhere: scale 1
    x[2, :16] = steps  # with amax 448 (scale 1): e4m3 ties to even, subnormals, -0, a denormal fp32
    x[2, 16:64] = 448.0
    x[3] = x[2] * 2.0 ** -30  # the same times a power of two: the same bytes but the scales
    x[4, :64] = 448.0 * (1 + 2.0 ** -23)  # just past a power of two: the next scale up
    x[5, :64] = torch.linspace(-1.0, 1.0, min(D, 64), device=DEV) * 2.0 ** 100
    x[6, -8:] = torch.tensor([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1e-40, 3e38, -0.0, 0.5, 65504.0],
                             device=DEV)  # bf16 ties (to even) in the rope dims
    return x


@pytest.mark.parametrize("D,dr", [(512, 64), (72, 8), (192, 64)])
def test_row_helpers_match_torch_bit_for_bit(D, dr):
    x = edge_rows(40, D, seed=D)
    nb = row_bytes(D, dr)
    b = torch.full((len(x), nb), 0xAB, dtype=torch.uint8, device=DEV)  # poisoned: padding must be written
    bd = triton.next_power_of_2(D)
    _store_rows_kernel[(len(x),)](x, b, D=D, DR=dr, BLOCK_D=bd, NB=nb)
    ref = quantize_rows(x, dr)
    assert torch.equal(b, ref), (b != ref).nonzero()[:8].tolist()
    y = torch.full_like(x, float("nan"))
    _load_rows_kernel[(triton.cdiv(len(x), 16),)](ref, y, len(x), D=D, DR=dr, BLOCK_N=16, BLOCK_D=bd, NB=nb)
    assert torch.equal(y, dequantize_rows(ref, D, dr))


@pytest.mark.parametrize("Id", [128, 16, 96])
def test_key_helpers_match_torch_bit_for_bit(Id):
    x = edge_rows(40, Id, seed=Id)
    codes = torch.full((len(x), Id), 0xAB, dtype=torch.uint8, device=DEV)  # poisoned: every byte must be written
    scales = torch.full((len(x),), float("nan"), device=DEV)
    bd = triton.next_power_of_2(Id)
    _store_keys_kernel[(len(x),)](x, codes, scales, ID=Id, BLOCK_D=bd)
    ref_codes, ref_scales = quantize_keys(x)
    assert torch.equal(codes, ref_codes), (codes != ref_codes).nonzero()[:8].tolist()
    assert torch.equal(scales.view(torch.int32), ref_scales.view(torch.int32))  # the scales' bits
    y = torch.full_like(x, float("nan"))
    _load_keys_kernel[(triton.cdiv(len(x), 16),)](ref_codes, ref_scales, y, len(x), ID=Id, BLOCK_N=16, BLOCK_D=bd)
    assert torch.equal(y, dequantize_keys(ref_codes, ref_scales))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Id", [128, 16, 96])
def test_query_rounding_matches_quantize_keys_bit_for_bit(Id, dtype):
    # runtime.indexer_q=e4m3: the score kernel rounds each head's q with quantize_vectors, which must give the
    # bytes and scale quantize_keys gives that vector (the torch path's round_keys), in fp32 and bf16 q alike.
    x = edge_rows(64, Id, seed=Id + 1).to(dtype)
    codes = torch.full((64, Id), 0xAB, dtype=torch.uint8, device=DEV)
    k = torch.full((64,), -999, dtype=torch.int32, device=DEV)
    _quantize_vectors_kernel[(1,)](x, codes, k, M=64, ID=Id, BLOCK_D=triton.next_power_of_2(Id))
    ref_codes, ref_scales = quantize_keys(x)
    assert torch.equal(codes, ref_codes), (codes != ref_codes).nonzero()[:8].tolist()
    assert torch.equal(torch.exp2(k.double()).float(), ref_scales)


# ------------------------------------------------------------------ sparse attention over FP8 rows


def fp8_attention_case(chunks, n_heads: int, ratio: int, dtype: torch.dtype, seed: int, D: int = 512, dr: int = 64,
                       **kw):
    """test_kernels_gpu's case with kv, window and compressed rows stored as FP8 bytes."""
    T, args = attention_case(chunks, n_heads, ratio, dtype, seed, D=D, dr=dr, **kw)
    args = list(args)
    for i in (1, 2, 4):  # kv, window, compressed
        if args[i] is not None:
            args[i] = quantize_rows(args[i], dr)
    return T, tuple(args)


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads", [64, 16] if not INTERPRET else [16])
def test_fp8_attention_decode(ratio, dtype, n_heads):
    positions = DECODE_POS if not INTERPRET else [0, 3, 127, 128, 129, 511]
    for i, p in enumerate(positions):
        T, args = fp8_attention_case([(0, p, 1)], n_heads, ratio, dtype, seed=i)
        out, ref = run_both(T, args, n_heads)
        assert rel_err(out, ref) < TOL[dtype], (p, rel_err(out, ref))
    T, args = fp8_attention_case([(i % 4, p, 1) for i, p in enumerate(positions)], n_heads, ratio, dtype, seed=99)
    out, ref = run_both(T, args, n_heads)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_attention_prefill_chunks(ratio, dtype):
    # window rows from the step's own FP8 rows and from the ring
    chunks = [(0, 200, 300), (1, 0, 256), (2, 1000, 1)] if not INTERPRET else [(0, 200, 40), (1, 0, 20), (2, 1000, 1)]
    if not INTERPRET:
        chunks.append((3, 3000, 512))
    T, args = fp8_attention_case(chunks, 64 if not INTERPRET else 16, ratio, dtype, seed=7)
    out, ref = run_both(T, args, args[0].shape[1])
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("splits_len", [32, 128, 4096])
def test_fp8_attention_forced_splits_match(splits_len):
    T, args = fp8_attention_case([(0, 700, 1), (1, 3000, 2), (2, 5, 1)], 16, 4, torch.float32, seed=3)
    out, ref = run_both(T, args, 16, config=AttnConfig(16, 32, 4, 1, splits_len))
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("split_len", [64, 4096])
@pytest.mark.parametrize("ratio", [4, 128])
def test_fp8_attention_value_split(split_len, ratio):
    # FP8 rows decoded by halves (the lower half all e4m3, the upper e4m3 and bf16 rope dims), the value
    # dims' halves in two programs, split over candidates and not
    T, args = fp8_attention_case([(0, 700, 1), (1, 3000, 2), (2, 5, 1)], 16, ratio, torch.float32, seed=13)
    out, ref = run_both(T, args, 16, config=AttnConfig(16, 32, 4, 1, split_len, 2))
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("n_cand", [1, 7, 64, 512])
@pytest.mark.parametrize("pattern", ["none", "packed", "alternate", "all"])
def test_fp8_attention_candidate_counts_and_padding(n_cand, pattern):
    # test_kernels_gpu's -1 patterns over FP8 rows (split over programs, attn_config's choice for two tokens)
    T, args = padded_picks_case(n_cand, pattern, torch.float32, case=fp8_attention_case)
    out, ref = run_both(T, args, 16)
    assert rel_err(out, ref) < TOL[torch.float32], (n_cand, pattern, rel_err(out, ref))


def test_fp8_attention_small_dims():
    # D = 72 = 64 nope + 8 rope (96-byte rows, tests/test_fp8_cache.py's dims), W = 16, 4 local heads
    for ratio in (0, 4, 128):
        T, args = fp8_attention_case([(0, 40, 20), (1, 300, 1)], 4, ratio, torch.float32, seed=5, D=72, dr=8, W=16,
                                     topk=8, max_len=512)
        out, ref = run_both(T, args, 4, D=72)
        assert rel_err(out, ref) < TOL[torch.float32]


# ------------------------------------------------------------------ indexer top-K over FP8 keys


def check_topk_fp8(case, n_keys: int, k: int, exact: bool) -> None:
    """Kernel picks over FP8 keys (codes and scales) against the torch path's over the same ones; near-ties of
    the K-th score may differ only where the inputs are not integers (test_kernels_gpu.check_topk's rule)."""
    q, w, keys, slot, nv, scales = case
    ref = torch_path.indexer_topk(q, w, keys, slot, nv, n_keys, k, key_scales=scales)
    got = indexer_topk(q, w, keys, slot, nv, n_keys, k, key_scales=scales)
    assert got.shape == ref.shape
    n = torch.minimum(nv, torch.tensor(n_keys, device=DEV)).clamp(max=ref.shape[1])
    kf = dequantize_keys(keys, scales)
    for t in range(len(nv)):
        m = int(n[t])
        r, o = ref[t].tolist(), got[t].tolist()
        assert o[m:] == [-1] * (len(o) - m) and -1 not in o[:m] and len(set(o[:m])) == m, f"token {t}"
        rs, os_ = set(r[:m]), set(o[:m])
        if exact:
            assert rs == os_, t
        elif rs != os_:
            logits = torch.einsum("hd,nd->hn", q[t].float(), kf[slot[t], :n_keys]).relu_()
            sc = (logits * w[t].float()[:, None]).sum(0) * (q.shape[2] ** -0.5 * q.shape[1] ** -0.5)
            kth = sc[r[m - 1]]
            for i in rs ^ os_:
                assert abs(float(sc[i] - kth)) <= 1e-5 * max(abs(float(kth)), 1e-6), (t, i)


def fp8_keys(case):
    """test_kernels_gpu.topk_case with its keys stored as FP8: (q, w, codes [slots, N, Id], slot, n_valid,
    scales [slots, N])."""
    q, w, keys, slot, nv = case
    codes, scales = quantize_keys(keys)
    return q, w, codes, slot, nv, scales


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_topk_exact_ties_and_counts(dtype):
    # integer keys in {-1, 0, 1}: amax 1 (or an all-zero key), stored exactly; scores exact on both paths
    n_keys, k = (2048, 512) if not INTERPRET else (256, 64)
    nv = [0, 1, 3, 63, 64, 65, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 5000]
    if INTERPRET:
        nv = [0, 1, 63, 64, 65, 200, 256, 300]
    check_topk_fp8(fp8_keys(topk_case(nv, n_keys, dtype, seed=1, integer=True)), n_keys, k, exact=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_topk_float_inputs(dtype):
    n_keys, k = (4096, 512) if not INTERPRET else (256, 32)
    nv = [4096, 3000, 1024, 600, 7, 4000] if not INTERPRET else [256, 200, 7]
    check_topk_fp8(fp8_keys(topk_case(nv, n_keys, dtype, seed=3, integer=False)), n_keys, k, exact=False)


@pytest.mark.skipif(INTERPRET, reason="the interpreter sums fp16 and bf16 dots in different orders")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_key_scores_equal_the_decoded_keys_scores(dtype):
    # Over FP8 keys the Triton score kernel widens the codes to fp16, scales bf16 q per head into fp16's range and
    # each sum by its key's scale (`_code_scores`). The scales are powers of two, so its scores are the kernel's over
    # the decoded keys (exact in q's dtype), bit for bit. Heads' q spans 2^-12 .. 2^12, keys' scales 2^-10 .. 2^10.
    # (The wgmma kernel sums in another order: tests/test_indexer_scores_wgmma_gpu.py.)
    n_keys = 4000
    nv = [0, 1, 65, 511, 3000, n_keys, 9000]
    q, w, keys, slot, nv_t = topk_case(nv, n_keys, dtype, seed=41, integer=False)
    q = (q.float() * torch.logspace(-12, 12, q.shape[1], base=2.0, device=DEV)[None, :, None]).to(dtype)
    keys = (keys.float() * torch.logspace(-10, 10, keys.shape[1], base=2.0, device=DEV)[None, :, None]).to(dtype)
    codes, scales = quantize_keys(keys)
    cfg = _config(len(nv), n_keys, stages=3)  # the Triton kernel
    got = indexer_scores(q, w, codes, slot, nv_t, n_keys, config=cfg, key_scales=scales)
    ref = indexer_scores(q, w, dequantize_keys(codes, scales).to(dtype), slot, nv_t, n_keys)
    for t, n in enumerate(nv):
        m = min(n, n_keys)
        assert torch.equal(got[t, :m], ref[t, :m]), t


def test_fp8_topk_small_heads():
    # tiny dims: 8 heads of 16 dims (16 code bytes and a scale a key), K = 8
    case = topk_case([0, 3, 9, 40, 128], 128, torch.float32, seed=5, integer=True, n_heads=8, dim=16)
    check_topk_fp8(fp8_keys(case), 128, 8, exact=True)


# ------------------------------------------------------------------ FP8 dot: e4m3 queries over FP8 keys


def fp8_dot_case(nv: list[int], n_keys: int, dtype: torch.dtype, seed: int, integer: bool, ih: int, idim: int):
    """test_kernels_gpu.topk_case with FP8 keys. Float inputs: each key and each head's q times its own power
    of two (2^-3 .. 2^3), so that scales differ key by key and a score taken with another key's scale is
    off by a factor >= 2. Integer inputs as they are (q in -2..2, keys in -1..1: module docstring)."""
    q, w, keys, slot, nv_t = topk_case(nv, n_keys, dtype, seed=seed, integer=integer, n_heads=ih, dim=idim)
    if not integer:
        g = torch.Generator(device=DEV).manual_seed(seed + 1)
        keys = keys * torch.exp2(torch.randint(-3, 4, (*keys.shape[:2], 1), generator=g, device=DEV)).to(dtype)
        q = q * torch.exp2(torch.randint(-3, 4, (*q.shape[:2], 1), generator=g, device=DEV)).to(dtype)
    return fp8_keys((q, w, keys, slot, nv_t))


def fp8_dot_reference(q, w, keys, scales, slot, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact scores of round_keys(q) and the stored keys (codes, scales), float64 [T, n_keys], and the bound
    the kernel's are held to: FP8_DOT_TOL * scale * sum_h |w[h]| * (|q_r[h]| . |k[n]|) (module docstring)."""
    qr = round_keys(q).double()
    kd = dequantize_keys(keys[slot, :n_keys], scales[slot, :n_keys], torch.float64)  # [T, n_keys, Id]
    scale = q.shape[2] ** -0.5 * q.shape[1] ** -0.5
    exact = torch.einsum("thn,th->tn", torch.einsum("thd,tnd->thn", qr, kd).relu(), w.double()) * scale
    size = torch.einsum("thn,th->tn", torch.einsum("thd,tnd->thn", qr.abs(), kd.abs()), w.double().abs()) * scale
    return exact, FP8_DOT_TOL * size


def check_fp8_dot_topk(case, n_keys: int, k: int, config, exact: bool) -> None:
    """The kernel with q_fp8 over FP8 keys against the torch path with q_fp8: every valid score within
    fp8_dot_reference's bound of the exact one; picks packed and unique, and as sets the torch path's
    (exact: integer inputs) or differing only where a score lies within twice the bound of the K-th."""
    q, w, keys, slot, nv, scales = case
    ref = torch_path.indexer_topk(q, w, keys, slot, nv, n_keys, k, q_fp8=True, key_scales=scales)
    got = indexer_topk(q, w, keys, slot, nv, n_keys, k, config=config, q_fp8=True, key_scales=scales)
    scores = indexer_scores(q, w, keys, slot, nv, n_keys, q_fp8=True, config=config, key_scales=scales).double()
    want, bound = fp8_dot_reference(q, w, keys, scales, slot, n_keys)
    assert got.shape == ref.shape
    for t in range(len(nv)):
        n = min(int(nv[t]), n_keys)
        far = (scores[t, :n] - want[t, :n]).abs() > bound[t, :n]
        assert not far.any(), (t, far.nonzero()[:5].flatten().tolist())
        m = min(n, ref.shape[1])
        r, o = ref[t].tolist(), got[t].tolist()
        assert o[m:] == [-1] * (len(o) - m) and -1 not in o[:m] and len(set(o[:m])) == m, f"token {t}"
        rs, os_ = set(r[:m]), set(o[:m])
        if exact:
            assert rs == os_, (t, sorted(rs - os_)[:5], sorted(os_ - rs)[:5])
        elif rs != os_:
            kth = float(want[t, r[m - 1]])
            slack = 2 * float(bound[t, :n].max()) + 1e-5 * abs(kth)
            for i in rs ^ os_:
                assert abs(float(want[t, i]) - kth) <= slack, (t, i)


FP8_DOT_DIMS = {"flash": (FLASH.index_n_heads, FLASH.index_head_dim, FLASH.index_topk),
                "small": (8, 48, 16)}  # small: heads padded to BLOCK_H 16, dims masked to BLOCK_D 64


@pytest.mark.parametrize("integer", [True, False], ids=["integer", "float"])
@pytest.mark.parametrize("select", SELECTS)
@pytest.mark.parametrize("T", [1, 3] if INTERPRET else [1, 3, 8, 33])
@pytest.mark.parametrize("dims", ["small"] if INTERPRET else ["flash", "small"])
def test_fp8_dot_topk_against_the_torch_path(dims, T, select, integer):
    # Key counts 0, 1, K - 1, K, K + 1 and all (n_keys): every count at every token count (fewer tokens
    # than counts: one call per rotation). 1 token: a run of 8 blocks a score program, 3: 3 (partial
    # last runs), else topk_config's. Both selects, each run dtype.
    ih, idim, k = FP8_DOT_DIMS[dims]
    n_keys = 300 if INTERPRET else 4000
    counts = [0, 1, k - 1, k, k + 1, n_keys]
    change = {"blocks": {1: 8, 3: 3}[T]} if T in (1, 3) else {}
    for dtype in DTYPES:
        for shift in range(len(counts) if T < len(counts) else 1):
            nv = [counts[(i + shift) % len(counts)] for i in range(T)]
            case = fp8_dot_case(nv, n_keys, dtype, seed=50 + T + shift, integer=integer, ih=ih, idim=idim)
            check_fp8_dot_topk(case, n_keys, k, _config(T, n_keys, select=select, **change), exact=integer)


# ------------------------------------------------------------------ quantizing kernels: kv row, compressors


def check_bytes_close(got: torch.Tensor, ref: torch.Tensor, decode) -> None:
    """uint8 rows: few differing bytes, dequantized rows within ROW_TOL (docstring)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype == torch.uint8
    frac = float((got != ref).double().mean())
    assert frac <= BYTES_DIFFER, f"{frac:.2e} of the bytes differ"
    assert rel_err(decode(got), decode(ref)) < ROW_TOL


def check_keys_close(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> None:
    """FP8 keys (codes uint8 [n, Id], scales fp32 [n]): few differing code bytes and few differing scales,
    dequantized keys within ROW_TOL (docstring)."""
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        frac = float((a != b).double().mean())
        assert frac <= BYTES_DIFFER, f"{frac:.2e} of the {a.dtype} values differ"
    assert rel_err(dequantize_keys(*got), dequantize_keys(*ref)) < ROW_TOL


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,dr", [(512, 64), (72, 8)])
def test_prepare_heads_quantizes_the_kv_row(dtype, D, dr):
    g = torch.Generator(device=DEV).manual_seed(D)
    T, H = (37, 8) if not INTERPRET else (5, 4)
    q = (torch.randn(T, H, D, generator=g, device=DEV) * 2).to(dtype)
    kv = (torch.randn(T, D, generator=g, device=DEV) * torch.logspace(-3, 3, T, device=DEV)[:, None]).to(dtype)
    kv[0] = 0.0
    ang = torch.arange(T, device=DEV)[:, None] * 10.0 ** -torch.arange(dr // 2, device=DEV)[None].float()
    cis = torch.polar(torch.ones_like(ang), ang)
    _, ref, _ = torch_heads(q, kv, cis, EPS, torch.uint8)
    out = torch.full((T, row_bytes(D, dr)), 0xAB, dtype=torch.uint8, device=DEV)  # poisoned: padding written
    prepare_heads(q.clone(), kv, out, cis, EPS, None)
    check_bytes_close(out, ref, lambda b: dequantize_rows(b, D, dr))


class FP8Case(Case):
    """test_compressor_kernel_gpu's Case with an FP8 cache: attention rows ("row") or indexer keys ("key": codes
    in outs, their scales in scales)."""

    def __init__(self, ratio: int, D: int, dtype: torch.dtype, slots: int, seed: int, dr: int, store: str):
        super().__init__(ratio, D, dtype, slots, seed, dr)
        for m in self.mods:
            m.store = store
        self.store = store
        if store == "row":
            out, scales = quantize_rows(self.outs[0].float(), dr), None
        else:
            out, scales = quantize_keys(self.outs[0].float())
        self.outs = [out.clone() for _ in self.mods]
        self.scales = [scales if scales is None else scales.clone() for _ in self.mods]

    def step(self, chunks: list[tuple[int, int, int]], n_pad: int = 0) -> int:
        b = step_batch(chunks, n_pad, self.ratio, self.trash, self.dr)
        kv, score = self.inputs(len(b.pos))
        for m, st, out, sc in zip(self.mods, self.states, self.outs, self.scales):
            m(kv, score, b, st, out, sc)
        (ref, got), (sr, sg), t = self.outs, self.states, self.trash
        if self.store == "row":
            check_bytes_close(got[:t].flatten(0, 1), ref[:t].flatten(0, 1),
                              lambda x: dequantize_rows(x, self.D, self.dr))
        else:
            ref_sc, got_sc = self.scales
            check_keys_close((got[:t].flatten(0, 1), got_sc[:t].flatten()),
                             (ref[:t].flatten(0, 1), ref_sc[:t].flatten()))
        assert torch.equal(sg.kv[:t], sr.kv[:t]) and torch.equal(sg.score[:t], sr.score[:t])
        return int((b.ix.blocks[self.ratio].emit_slot != t).sum())


FP8_COMPRESSORS = [(4, 512, 64, "row"), (128, 512, 64, "row"), (4, 128, 64, "key"), (4, 72, 8, "row"),
                   (4, 16, 8, "key")]


@pytest.mark.parametrize("ratio,D,dr,store", FP8_COMPRESSORS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_compressor_decode_and_prefill(ratio, D, dr, store, dtype):
    positions = [0, 1, 3, 4, 7, 126, 127, 128, 255, 1023, 4095] if not INTERPRET else [0, 3, 7, 127]
    case = FP8Case(ratio, D, dtype, slots=len(positions), seed=ratio + D, dr=dr, store=store)
    assert case.step([(i, p, 1) for i, p in enumerate(positions)], n_pad=3) == sum(
        (p + 1) % ratio == 0 for p in positions)
    n = 300 if not INTERPRET else 130
    case = FP8Case(ratio, D, dtype, slots=2, seed=1, dr=dr, store=store)
    assert case.step([(0, 0, n), (1, 201, 70)], n_pad=2) > 0


# ------------------------------------------------------------------ capture


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("ratio", [4, 128])
def test_fp8_kernels_replay_in_a_cuda_graph(ratio):
    # Captured once on one step's tensors, replayed after every device input changed (positions, FP8 rows and
    # keys, picks, counts): the replay equals the torch path on the new inputs.
    chunks_a = [(i % 4, 50 + 300 * i, 1) for i in range(8)]
    chunks_b = [(i % 4, 4000 - 450 * i, 1) for i in range(8)]
    T, a = fp8_attention_case(chunks_a, 64, ratio, torch.bfloat16, seed=11)
    _, b = fp8_attention_case(chunks_b, 64, ratio, torch.bfloat16, seed=12)
    tq = fp8_keys(topk_case([p // 4 for _, p, _ in chunks_a], 1024, torch.bfloat16, seed=13, integer=True))
    tb = fp8_keys(topk_case([p // 4 for _, p, _ in chunks_b], 1024, torch.bfloat16, seed=14, integer=True))
    assert_graph_replay_follows_inputs(T, a, b, tq, tb)


# ------------------------------------------------------------------ the whole stack


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="runtime.kernels=triton needs a CUDA device")
@pytest.mark.parametrize("indexer_q", ["bf16", "e4m3"])
@pytest.mark.parametrize("mode", ["eager", "full_and_breakable"])
def test_tiny_run_with_fp8_caches_triton_matches_torch(mode, indexer_q):
    # tiny dims with 64-dim nope blocks (D = 72), fp32: every kernel with FP8 caches against the torch path
    # with FP8 caches, and the full graph's replay. Both quantize the same rows; where a value sits within fp32
    # noise of an e4m3 midpoint the two round apart (docstring), hence check.py's FP8-cache tolerance.
    # indexer_q=e4m3: the indexers' FP8 dots in the layers and their graphs. Their accumulation may flip a
    # borderline pick against the torch path (docstring), so here the top-K keeps every entry (128 = max_len / 4):
    # the picks are the kernel tests' business, this is the setting's path through the stack.
    from tp_runtime.config import load_config
    from tp_runtime.engine.entry import in_process
    from tp_runtime.verify.check import FP8_CACHE_TOLERANCES, max_rel_err
    from conftest import TINY_PATH as TINY

    base = ["parallel.tp=1", "parallel.launcher=local", "runtime.device=cuda", "workload.requests=4",
            "model.head_dim=72", "model.qk_rope_head_dim=8", "runtime.cache_format=fp8",
            f"runtime.indexer_q={indexer_q}"] + (["model.index_topk=128"] if indexer_q == "e4m3" else [])
    tri = in_process(load_config(TINY, base + ["runtime.kernels=triton", f"graph.mode={mode}"]), keep_outputs=True)
    ref = in_process(load_config(TINY, base + ["runtime.kernels=torch", "graph.mode=eager"]), keep_outputs=True)
    assert tri.kernels == "triton" and ref.kernels == "torch"
    assert max_rel_err(tri.outputs, ref.outputs) <= FP8_CACHE_TOLERANCES["float32"]


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="the bench with FP8 caches needs a CUDA device")
def test_tiny_bench_with_cache_format_lanes(tmp_path, capsys):
    # bf16 and FP8 caches as interleaved lanes of one sweep (tiny dims with 64-dim nope blocks): records carry
    # the cache format, memory per rank and the fit table; the roofline counts fewer cache bytes for FP8.
    from pathlib import Path

    from tp_runtime.bench.report import read_jsonl
    from tp_runtime.cli import main as cli_main

    sweep = Path(__file__).resolve().parents[1] / "configs" / "bench_tiny.yaml"
    rc = cli_main(["bench", str(sweep), "runtime.device=cuda", "grid.parallel.tp=[1]", "model.head_dim=72",
                   "grid.modes=[full@kv_bf16,full@kv_fp8]", "bench.prefill_check=false", f"bench.output={tmp_path}"])
    assert rc == 0
    capsys.readouterr()
    points = read_jsonl(tmp_path / "tiny" / "points.jsonl")
    by = {(p["mode"], p["batch"], p["context"]): p for p in points}
    for (mode, batch, ctx), p in by.items():
        assert p["cache_format"] == ("fp8" if mode.endswith("kv_fp8") else "bf16") and p["outputs_finite"]
        assert p["memory_bytes_per_rank"] == p["weight_bytes_per_rank"] + p["cache_bytes_per_rank"] > 0
        assert all(b > 0 for b in p["largest_batch_by_context"].values())
        if mode.endswith("kv_fp8"):
            other = by[("full@kv_bf16", batch, ctx)]
            assert p["roofline_cache_bytes"] < other["roofline_cache_bytes"]
            assert p["cache_bytes_per_rank"] < other["cache_bytes_per_rank"]
    comps = read_jsonl(tmp_path / "tiny" / "comparisons.jsonl")
    assert any(c["what"] == "kv_fp8_vs_bf16" for c in comps)
