"""The Triton kernels of stage B against the torch path, on random inputs.

Run on a GPU machine: `pytest -m gpu tests/test_kernels_gpu.py`. Where Triton is installed without a
GPU, `TRITON_INTERPRET=1 pytest -m gpu tests/test_kernels_gpu.py` runs the same checks on the CPU
through Triton's interpreter (slowly; it checks indexing and masking, not the compiled code).

Tolerances (relative error of each token's output row, ||a - b|| / ||b||):
- bf16: both paths accumulate in fp32 from bf16 inputs; the torch path rounds o to bf16 before the
  inverse rotary and the kernel rounds once after it, and the kernel feeds p to the second product in
  bf16. Each is ~2^-9 relative per element, so rows differ by ~3e-3; 1e-2 leaves room, while a wrong
  row, mask or sink moves a row by far more (a dropped candidate among 640 moves it by ~1e-1 or more).
- fp32: exact products (dots in IEEE fp32), summation order differs: ~1e-6; 2e-5.
- top-K: with integer-valued inputs every score is exact on both paths, so the index sets must be
  identical, ties included (broken to the lower index). With float inputs the two paths may round
  a score differently by an ulp, so a pick may differ only where the two scores lie within 1e-5
  (relative) of the K-th score. The same holds with q rounded to e4m3 (q_fp8, runtime.indexer_q=e4m3)
  over keys in q's dtype: the kernel rounds q exactly as the torch path's round_keys (exact in q's dtype)
  and keeps its dot. Over FP8 keys q_fp8 is an FP8 dot: tests/test_fp8_cache_gpu.py.
"""

from __future__ import annotations


import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS

from tp_runtime.config import ModelConfig
from tp_runtime.ops.torch_path import sparse_attention_sink as sparse_attention_torch
from tp_runtime.model.rope import RotaryTable
from tp_runtime.model.step_index import ring_index
from tp_runtime.ops import torch_path
from tp_runtime.ops.cache_fp8 import dequantize_keys, quantize_keys, round_keys

triton = pytest.importorskip("triton")

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE

from tp_runtime.ops.indexer_topk import SELECTS, TopkConfig, indexer_scores, indexer_topk, topk_config
from tp_runtime.ops.sparse_attention import AttnConfig, attn_config, sparse_attention_sink

FLASH = ModelConfig()  # the released Flash dims are the defaults
TOL = {torch.bfloat16: 1e-2, torch.float32: 2e-5}
# Triton's interpreter computes bf16 products wrongly (numpy has no bf16): there, fp32 only.
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float32]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max())


# ------------------------------------------------------------------ a step of several sequences


class Step:
    """T tokens of chunks (slot, first position, length) with caches and a RingIndex of W rows."""

    def __init__(self, chunks: list[tuple[int, int, int]], W: int, trash: int):
        rows = [[], [], [], [], []]
        i = 0
        for slot, start, length in chunks:
            rows[0] += [slot] * length
            rows[1] += range(start, start + length)
            rows[2] += [i] * length
            rows[3] += [start] * length
            rows[4] += [start + length - 1] * length
            i += length
        self.slot, self.pos, start_idx, start_pos, last_pos = torch.tensor(rows, dtype=torch.long, device=DEV)
        self.T = i
        self.ring = ring_index(W, self.slot, self.pos, start_idx, start_pos, last_pos, trash)


def attention_case(chunks, n_heads: int, ratio: int, dtype: torch.dtype, seed: int, D: int = 512, dr: int = 64,
                   W: int = 128, topk: int = 512, max_len: int = 4096, slots: int = 4):
    g = _gen(seed)
    st = Step(chunks, W, trash=slots)
    T = st.T

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=DEV) * scale).to(dtype)

    # q scaled so that the softmax is neither flat nor one-hot: |s| ~ 3
    q = randn(T, n_heads, D, scale=3.0)
    kv = randn(T, D)
    window = randn(slots + 1, W, D)
    sink = torch.randn(n_heads, generator=g, device=DEV)
    table = RotaryTable(dr, FLASH.compress_rope_theta, FLASH.rope_scaling, max_len + 1, DEV)
    cis = table.at(st.pos)
    compressed = picks = n_done = None
    n_comp = 0
    if ratio:
        compressed = randn(slots + 1, -(-max_len // ratio), D)
        n_done = (st.pos + 1) // ratio
        if ratio == 4:
            n_comp = min(topk, max_len // 4)
            picks = torch.full((T, n_comp), -1, dtype=torch.long, device=DEV)
            for t in range(T):  # as the indexer leaves them: distinct valid entries first, then -1
                n = min(n_comp, int(n_done[t]))
                picks[t, :n] = torch.randperm(int(n_done[t]), generator=g, device=DEV)[:n]
        else:
            n_comp = max_len // ratio
    args = (q, kv, window, st.ring, compressed, st.slot, picks, n_done, n_comp, sink, D ** -0.5, cis)
    return T, args


def run_both(T, args, n_heads, D=512, config=None):
    ref = torch.full((T, n_heads * D), float("nan"), dtype=args[0].dtype, device=DEV)
    sparse_attention_torch(*args, ref)
    out = torch.full_like(ref, float("nan"))  # poisoned: an unwritten element fails
    sparse_attention_sink(*args, out, config=config)
    assert not out.isnan().any()
    return out, ref


# Contexts around the window edge (127, 128) and the 4- and 128-token block edges; 0: no compressed entry.
DECODE_POS = [0, 2, 3, 4, 126, 127, 128, 129, 255, 256, 511, 2047, 4095]


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads", [64, 32, 16, 8])
def test_attention_decode(ratio, dtype, n_heads):
    # One decode token per slot at each context; T = 1 (split over programs) and a batch of them.
    for i, p in enumerate(DECODE_POS):
        T, args = attention_case([(0, p, 1)], n_heads, ratio, dtype, seed=i)
        out, ref = run_both(T, args, n_heads)
        assert rel_err(out, ref) < TOL[dtype], (p, rel_err(out, ref))
    chunks = [(i % 4, p, 1) for i, p in enumerate(DECODE_POS)]
    T, args = attention_case(chunks, n_heads, ratio, dtype, seed=99)
    out, ref = run_both(T, args, n_heads)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_prefill_chunks(ratio, dtype):
    # A 300-token chunk after 200 cached positions, a 256-token chunk from position 0, one decode token:
    # window rows come from the step's own rows and from the ring.
    chunks = [(0, 200, 300), (1, 0, 256), (2, 1000, 1)]
    if not INTERPRET:
        chunks.append((3, 3000, 512))
    T, args = attention_case(chunks, 64, ratio, dtype, seed=7)
    out, ref = run_both(T, args, 64)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("splits_len", [32, 128, 4096])
def test_attention_forced_splits_match(splits_len):
    # The split path (partials + combine) and the single pass give the same rows at any split size.
    T, args = attention_case([(0, 700, 1), (1, 3000, 2), (2, 5, 1)], 16, 4, torch.float32, seed=3)
    out, ref = run_both(T, args, 16, config=AttnConfig(16, 32, 4, 1, splits_len))
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("split_len", [64, 4096])
@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_value_split(split_len, ratio, dtype):
    # The value dims' halves in two programs (each scores whole rows): the torch path's rows, with the
    # candidates split over programs (64) and in one pass (4096); 16 heads, and 64 on a GPU.
    chunks = [(0, 700, 1), (1, 3000, 2), (2, 5, 1), (3, 127, 1)]
    for n_heads in [16] if INTERPRET else [16, 64]:
        T, args = attention_case(chunks, n_heads, ratio, dtype, seed=11)
        out, ref = run_both(T, args, n_heads, config=AttnConfig(min(n_heads, 64), 32, 4, 1, split_len, 2))
        assert rel_err(out, ref) < TOL[dtype], (n_heads, rel_err(out, ref))


# Which of a token's n picks are valid (the rest -1), as masks over the pick positions: none, one, the
# indexer's packing (valid first), -1 first, every other one, all. The kernel reads min(n_done, n) picks
# and masks each -1 wherever it stands; the torch twin masks them too.
PICK_PATTERNS = {
    "none": lambda n: torch.zeros(n, dtype=torch.bool),
    "first": lambda n: torch.arange(n) < 1,
    "packed": lambda n: torch.arange(n) < (n + 1) // 2,
    "tail": lambda n: torch.arange(n) >= n // 2,
    "alternate": lambda n: torch.arange(n) % 2 == 0,
    "all": lambda n: torch.ones(n, dtype=torch.bool),
}


def padded_picks_case(n_cand: int, pattern: str, dtype: torch.dtype, case=None):
    """Two decode tokens at positions 4095 and 3000 (1024 and 750 completed entries: every pick position is
    within the token's count) choosing n_cand picks, then -1 where the pattern says."""
    T, args = (case or attention_case)([(0, 4095, 1), (1, 3000, 1)], 16, 4, dtype, seed=n_cand, topk=n_cand)
    picks = args[6]
    picks[:, ~PICK_PATTERNS[pattern](n_cand).to(DEV)] = -1
    return T, args


@pytest.mark.parametrize("n_cand", [1, 7, 64, 512])
@pytest.mark.parametrize("pattern", list(PICK_PATTERNS))
@pytest.mark.parametrize("split", [True, False])
def test_attention_candidate_counts_and_padding(n_cand, pattern, split):
    # 1, 7, 64 and 512 compressed candidates behind the 128 window rows, under every -1 pattern, with the
    # candidates split over programs (attn_config's choice for two tokens) and in one pass.
    T, args = padded_picks_case(n_cand, pattern, torch.float32)
    out, ref = run_both(T, args, 16, config=None if split else AttnConfig(16, 32, 4, 1, 4096))
    assert rel_err(out, ref) < TOL[torch.float32], (n_cand, pattern, rel_err(out, ref))


def test_attn_config_splits_few_tokens_into_one_tile_a_program():
    # Decode at batch 1-2 (64 heads) and on an 8-head shard: 16 heads a program, one tile of 32 rows a program
    # where those programs fit on the SMs at once, else 64; a program of one tile runs one stage. Many tokens: no split.
    for n_tokens, n_heads, n_cand, rows in [(1, 64, 640, 32), (2, 64, 416, 32), (2, 64, 640, 64), (8, 8, 640, 64)]:
        cfg = attn_config(n_tokens, n_heads, n_cand, 512, 132)
        assert (cfg.block_h, cfg.block_n, cfg.split_len, cfg.num_stages) == (16, rows, rows, 1), (n_tokens, cfg)
    for n_tokens in range(1, 129):
        for n_cand in (160, 416, 640):
            for fp8 in (False, True):
                cfg = attn_config(n_tokens, 64, n_cand, 512, 132, fp8)
                assert cfg.split_len % cfg.block_n == 0 and (cfg.num_stages == 1) == (cfg.split_len == cfg.block_n)
    assert attn_config(128, 64, 640, 512, 132).split_len >= 640


def test_attention_tiny_dims():
    # tiny.yaml's dims (D = 32, Dr = 8, W = 16, 4 local heads): blocks mix window and compressed rows.
    for ratio in (0, 4, 128):
        T, args = attention_case([(0, 40, 20), (1, 300, 1)], 4, ratio, torch.float32, seed=5, D=32, dr=8, W=16,
                                 topk=8, max_len=512)
        out, ref = run_both(T, args, 4, D=32)
        assert rel_err(out, ref) < TOL[torch.float32]


# ------------------------------------------------------------------ indexer top-K


def topk_case(n_valid: list[int], n_keys: int, dtype, seed: int, integer: bool, n_heads=64, dim=128, slots=4):
    g = _gen(seed)
    T = len(n_valid)
    if integer:  # small integers: every dot product and weighted sum is exact in fp32 -> exact ties
        q = torch.randint(-2, 3, (T, n_heads, dim), generator=g, device=DEV).to(dtype)
        keys = torch.randint(-1, 2, (slots + 1, n_keys + 3, dim), generator=g, device=DEV).to(dtype)
        w = torch.randint(-2, 3, (T, n_heads), generator=g, device=DEV).to(dtype)
    else:
        q = torch.randn(T, n_heads, dim, generator=g, device=DEV).to(dtype)
        keys = torch.randn(slots + 1, n_keys + 3, dim, generator=g, device=DEV).to(dtype)
        w = torch.randn(T, n_heads, generator=g, device=DEV).to(dtype)
    slot = torch.randint(0, slots + 1, (T,), generator=g, device=DEV)
    return q, w, keys, slot, torch.tensor(n_valid, dtype=torch.long, device=DEV)


def _scores(q, w, keys, slot, n_keys):
    """The torch path's score (its own expression, fp32)."""
    kk = keys[slot, :n_keys].float()
    logits = torch.einsum("thd,tnd->thn", q.float(), kk).relu_()
    return torch.einsum("thn,th->tn", logits, w.float()) * (q.shape[2] ** -0.5 * q.shape[1] ** -0.5)


def check_topk(case, n_keys: int, k: int, exact: bool, config: TopkConfig | None = None, q_fp8: bool = False):
    q, w, keys, slot, nv = case
    ref = torch_path.indexer_topk(q, w, keys, slot, nv, n_keys, k, q_fp8=q_fp8)
    got = indexer_topk(q, w, keys, slot, nv, n_keys, k, config=config, q_fp8=q_fp8)
    q = round_keys(q) if q_fp8 else q  # the query the scores are of
    assert got.shape == ref.shape and got.dtype == ref.dtype
    n = torch.minimum(nv, torch.tensor(n_keys, device=DEV)).clamp(max=ref.shape[1])
    for t in range(len(nv)):
        r, o = ref[t].tolist(), got[t].tolist()
        m = int(n[t])
        assert o[:m].count(-1) == 0 and o[m:] == [-1] * (len(o) - m), f"token {t}: picks not packed"
        rs, os_ = set(r[:m]), set(o[:m])
        assert len(os_) == m, f"token {t}: repeated picks"
        if exact:
            assert rs == os_, f"token {t}: {sorted(rs - os_)[:5]} vs {sorted(os_ - rs)[:5]}"
        elif rs != os_:  # only near-ties of the K-th score may differ
            sc = _scores(q[t:t + 1], w[t:t + 1], keys, slot[t:t + 1], n_keys)[0]
            kth = sc[r[m - 1]]
            for i in rs ^ os_:
                assert abs(float(sc[i] - kth)) <= 1e-5 * max(abs(float(kth)), 1e-6), (t, i)


def _config(n_tokens: int, n_keys: int, **change) -> TopkConfig:
    return topk_config(n_tokens, n_keys, 132)._replace(**change)


@pytest.mark.parametrize("select", SELECTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_exact_ties_and_counts(dtype, select):
    # Integer inputs: many exact ties (relu zeros, equal sums). Counts: none, fewer than K, exactly K,
    # K + 1, block edges of the score kernel (64) and select chunks (1024), all keys valid. Both selects.
    n_keys, k = 2048, 512
    nv = [0, 1, 3, 63, 64, 65, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 5000]
    check_topk(topk_case(nv, n_keys, dtype, seed=1, integer=True), n_keys, k, exact=True,
               config=_config(len(nv), n_keys, select=select))


# Fused-select configurations: first digit of 8 / 11 / 12 bits, later digits of 8 / 10 / 5 bits (a last
# digit narrower than the others: 20 = 2 x 8 + 4, 21 = 2 x 10 + 1; 20 = 4 x 5), 1, 3 or 8 blocks a score
# program (145, 49 or 19 programs a token at 9236 keys), steps of 64 scores (many steps per pass) or 1024.
FUSED_CONFIGS = [dict(), dict(hi_bits=8, lo_bits=8, blocks=8, chunk=64), dict(hi_bits=11, lo_bits=10, blocks=1),
                 dict(hi_bits=12, lo_bits=5, chunk=64, blocks=3)]
# Split selects: the default (runs of 512 scores for these 8 tokens: 19 a token at 9236 keys; tokens of up to 2048
# keys in registers), runs of 256 with an 8-bit first digit and tokens of up to 256 keys in registers (bins so wide
# that the threshold bin's keys outgrow the sort and go digit by digit), of 2048 with 5-bit later digits, of 1024.
SPLIT_CONFIGS = [dict(select="split"), dict(select="split", chunk=256, hi_bits=8, select_warps=4, regs_upto=256),
                 dict(select="split", chunk=2048, lo_bits=5), dict(select="split", chunk=1024)]


@pytest.mark.parametrize("change", FUSED_CONFIGS + SPLIT_CONFIGS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "dflt")
def test_topk_long_context(change):
    # A 32K-context step's key counts (n_keys = 9236 = max_len / 4): 8192+ keys over many score programs a
    # token, counts around K, all valid; integer inputs (exact ties). 8 heads of 16 dims keep the
    # interpreter quick; the select sees only scores.
    n_keys, k = 9236, 512
    nv = [8192, 9236, 20000, 511, 512, 513, 4097, 0]
    case = topk_case(nv, n_keys, torch.float32, seed=21, integer=True, n_heads=8, dim=16)
    check_topk(case, n_keys, k, exact=True, config=_config(len(nv), n_keys, **change))


def test_topk_config_cuts_long_contexts_into_short_runs_where_few_tokens():
    # Runs of 512 scores where T x ceil(n_keys / 512) programs are resident at once (three an SM), else 2048;
    # tokens of up to 2048 keys in registers (and no bins counted for them) at every batch.
    for n_tokens in range(1, 300):
        cfg = topk_config(n_tokens, 9236, 132)
        assert cfg.select == "split" and cfg.regs_upto == 2048, (n_tokens, cfg)
        assert cfg.chunk == (512 if n_tokens * 19 <= 3 * 132 else 2048), (n_tokens, cfg)
    assert [topk_config(t, 1024, 132).chunk for t in (198, 199)] == [512, 2048]  # 2 runs a token
    assert topk_config(2, 300000, 132).chunk == 2048


def test_split_select_runs_beyond_the_resident_programs():
    # 48 tokens of a 32K capacity in runs of 256 scores: 48 x 37 programs, more than a GPU holds at once, so
    # tickets go out over several waves and a run waits on earlier runs' published counts, whose programs are
    # running or done (tickets go in start order). Mixed counts
    # (long, at the register bound and past it, short); integer inputs (exact ties): the picks equal the radix
    # select's as sets.
    n_keys, k = 9236, 512
    nv = [9236, 8192, 2049, 2048, 600, 5000, 0, 8000] * 6
    case = topk_case(nv, n_keys, torch.float32, seed=31, integer=True, n_heads=8, dim=16)
    cfg = _config(len(nv), n_keys, select="split", chunk=256)
    check_topk(case, n_keys, k, exact=True, config=cfg)
    radix = indexer_topk(*case, n_keys, k, config=cfg._replace(select="radix", chunk=1024))
    assert torch.equal(indexer_topk(*case, n_keys, k, config=cfg).sort(dim=1).values, radix.sort(dim=1).values)


def test_split_select_sorts_every_candidate_count():
    # Float scores, first digits of 9 to 12 bits: the threshold bin holds from tens to about a thousand keys over
    # these tokens (each range asserted below: the draws differ on the CPU and the GPU), so the split select
    # sorts them in each of its sizes (128, 256, 512 slots) and lists more than 512 digit by digit. Its picks
    # are the radix select's (the same scores: no near-tie may differ) and the torch twin's up to near-ties of
    # the K-th score.
    n_keys, k = 9236, 512
    nv = [8192, 9236, 6000, 3000]
    case = topk_case(nv, n_keys, torch.float32, seed=41, integer=False, n_heads=8, dim=16)
    sc = _scores(*case[:4], n_keys)
    counts = []
    for hi_bits in (9, 10, 11, 12):
        cfg = _config(len(nv), n_keys, select="split", hi_bits=hi_bits)
        for t, n in enumerate(nv):
            key = sc[t, :min(n, n_keys)].contiguous().view(torch.int32).long()
            digit = (torch.where(key < 0, key ^ 0x7FFFFFFF, key) + 2 ** 31) >> (32 - hi_bits)
            counts.append(int((digit == digit.sort(descending=True).values[k - 1]).sum()))
        check_topk(case, n_keys, k, exact=False, config=cfg)
        radix = indexer_topk(*case, n_keys, k, config=cfg._replace(select="radix", chunk=1024))
        got = indexer_topk(*case, n_keys, k, config=cfg)
        assert torch.equal(got.sort(dim=1).values, radix.sort(dim=1).values), hi_bits
    for lo, hi in [(1, 128), (129, 256), (257, 512), (513, n_keys)]:
        assert any(lo <= c <= hi for c in counts), (lo, hi, counts)


# Register selects: 8-bit digits from 1024 scores up (the default), 11-bit digits (a last digit of 10) from 256
# up with 4 warps (7 register sizes), 5-bit digits (a last of 2) with 16 warps.
REGS_CONFIGS = [dict(select="regs"), dict(select="regs", lo_bits=11, chunk=256, select_warps=4),
                dict(select="regs", lo_bits=5, select_warps=16)]


@pytest.mark.parametrize("change", REGS_CONFIGS, ids=["default", "bits11", "bits5"])
def test_topk_regs_equals_radix_at_every_register_size(change):
    # Counts at and either side of each register size's edge (256 .. 16384 scores), K and K + 1, past
    # n_keys; integer inputs (exact ties, all four digits resolved) and float ones (the passes stop early):
    # the register select gives the radix select's picks in the same order (index order), bit for bit.
    n_keys, k = 9236, 512
    nv = [8192, 9236, 20000, 511, 512, 513, 1024, 1025, 2048, 2049, 4096, 4097, 8193, 0]
    for integer in (True, False):
        case = topk_case(nv, n_keys, torch.float32, seed=23 + integer, integer=integer, n_heads=8, dim=16)
        cfg = _config(len(nv), n_keys, **change)
        check_topk(case, n_keys, k, exact=integer, config=cfg)
        radix = indexer_topk(*case, n_keys, k, config=cfg._replace(select="radix", chunk=1024))
        assert torch.equal(indexer_topk(*case, n_keys, k, config=cfg), radix)


@pytest.mark.parametrize("change", FUSED_CONFIGS[:2] + REGS_CONFIGS[:1] + SPLIT_CONFIGS[:2],
                         ids=["default", "hi8", "regs", "split", "split-hi8"])
def test_topk_long_context_ties_and_negative_scores(change):
    # w = 0 over 8192 keys: one bin holds every key, the later digits walk all of them; the K lowest
    # indices win. w <= 0: every score <= 0 (relu zeros give -0.0 and +0.0, which tie), the largest are
    # the least negative.
    n_keys, k = 9236, 512
    q, w, keys, slot, nv = topk_case([8192, 9000, 600], n_keys, torch.float32, seed=22, integer=True, n_heads=8,
                                     dim=16)
    cfg = _config(3, n_keys, **change)
    check_topk((q, torch.zeros_like(w), keys, slot, nv), n_keys, k, exact=True, config=cfg)
    got = indexer_topk(q, torch.zeros_like(w), keys, slot, nv, n_keys, k, config=cfg)
    assert all(sorted(got[t].tolist()) == list(range(k)) for t in range(3))
    check_topk((q, -w.abs(), keys, slot, nv), n_keys, k, exact=True, config=cfg)
    check_topk((q, -w.abs() - 1, keys, slot, nv), n_keys, k, exact=True, config=cfg)  # no w = 0 head


def test_topk_all_scores_tie():
    # w = 0: every score is 0 (or -0): the K lowest indices win.
    q, w, keys, slot, nv = topk_case([900, 100, 2000], 2048, DTYPES[0], seed=2, integer=True)
    check_topk((q, torch.zeros_like(w), keys, slot, nv), 2048, 512, exact=True)
    got = indexer_topk(q, torch.zeros_like(w), keys, slot, nv, 2048, 512)
    assert sorted(got[0].tolist()) == list(range(512)) and sorted(got[2].tolist()) == list(range(512))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_float_inputs(dtype):
    n_keys, k = 4096, 512
    nv = [4096, 3000, 1024, 600, 7, 4000]
    case = topk_case(nv, n_keys, dtype, seed=3, integer=False)
    check_topk(case, n_keys, k, exact=False)
    # The two selects see the same scores (the score kernel is shared): identical sets, float ties or not.
    got = [indexer_topk(*case, n_keys, k, config=_config(len(nv), n_keys, select=s)) for s in SELECTS]
    assert all(torch.equal(got[0].sort(dim=1).values, g.sort(dim=1).values) for g in got[1:])


# The score kernel's launches: 1-3 blocks of keys in flight (num_stages 2-4), 64-key blocks on 4 warps and 128-key
# blocks on 8, runs of 1, 3 and 8 blocks; bf16 keys and FP8 ones (codes and scales). Integer inputs: every dot
# and weighted sum is exact in fp32, so the kernel's scores equal the twin's bit for bit, whatever the order.
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("block_n,warps", [(64, 4), (128, 8)])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_keys", "fp8_keys"])
def test_indexer_scores_at_every_pipeline_depth_and_tile(stages, block_n, warps, fp8):
    n_keys = 600 if INTERPRET else 4000
    nv = [0, 1, 63, 64, 65, 127, 128, 129, 500, n_keys, 9000]
    q, w, keys, slot, nv_t = topk_case(nv, n_keys, DTYPES[0], seed=31, integer=True)
    kw, ref_keys = {}, keys
    if fp8:
        codes, scales = quantize_keys(keys)
        keys, kw, ref_keys = codes, dict(key_scales=scales), dequantize_keys(codes, scales)
    ref = _scores(q, w, ref_keys, slot, n_keys)
    for blocks in (1, 3, 8):
        cfg = _config(len(nv), n_keys, block_n=block_n, num_warps=warps, stages=stages, blocks=blocks)
        got = indexer_scores(q, w, keys, slot, nv_t, n_keys, config=cfg, **kw)
        for t, n in enumerate(nv):
            m = min(n, n_keys)
            assert torch.equal(got[t, :m], ref[t, :m]), (blocks, t)


def test_topk_shapes_and_small_heads():
    # k > n_keys (short max_len): [T, n_keys]; tiny dims (8 heads of 16 dims, K = 8).
    check_topk(topk_case([5, 100, 128], 128, torch.float32, seed=4, integer=True), 128, 512, exact=True)
    check_topk(topk_case([0, 3, 9, 40, 128], 128, torch.float32, seed=5, integer=True, n_heads=8, dim=16),
               128, 8, exact=True)
    q, w, keys, slot, nv = topk_case([3], 16, torch.float32, seed=6, integer=True)
    assert indexer_topk(q, w, keys, slot, nv, 0, 512).shape == (1, 0)


# runtime.indexer_q=e4m3 with keys in q's dtype: the kernel rounds each head's q (cache_fp8's integer-exact
# helpers) and keeps its dot. Dims: Flash's, and small ones with padded heads (8 of BLOCK_H 16) and dims (48
# of BLOCK_D 64); (Ih, Id) pairs with Id 32..128 in the interpreter.
Q_FP8_DIMS = [(16, 32), (16, 48), (16, 128)] if INTERPRET else [(64, 128), (8, 48)]


@pytest.mark.parametrize("select", SELECTS)
@pytest.mark.parametrize("ih,idim", Q_FP8_DIMS)
def test_topk_q_fp8_picks_and_scores_of_the_rounded_query(ih, idim, select):
    # Float inputs (the rounding moves q: the picks differ from the unrounded ones): the same picks as the
    # torch path with q_fp8 but for near-ties of the K-th score, and the score kernel's scores those of
    # round_keys(q) within float summation noise (a query rounded otherwise moves them by ~1e-2).
    n_keys, k = (300, 16) if INTERPRET else (4000, 512)
    nv = [300, 64] if INTERPRET else [4000, 3000, 512, 513, 1, 0, 2047, 600]
    for dtype in DTYPES:
        case = topk_case(nv, n_keys, dtype, seed=40 + idim, integer=False, n_heads=ih, dim=idim)
        cfg = _config(len(nv), n_keys, select=select)
        check_topk(case, n_keys, k, exact=False, config=cfg, q_fp8=True)
        q, w, keys, slot, nv_t = case
        got = indexer_scores(q, w, keys, slot, nv_t, n_keys, q_fp8=True, config=cfg)
        ref, plain = (_scores(x, w, keys, slot, n_keys) for x in (round_keys(q), q))
        for t, m in enumerate(min(n, n_keys) for n in nv):
            if m:
                top = float(ref[t, :m].abs().max())
                assert float((got[t, :m] - ref[t, :m]).abs().max()) <= 1e-5 * top, (dtype, t)
                assert m < 10 or float((plain[t, :m] - ref[t, :m]).abs().max()) > 1e-3 * top  # rounding matters
    check_topk(topk_case(nv, n_keys, DTYPES[0], seed=41, integer=True, n_heads=ih, dim=idim), n_keys, k, exact=True,
               config=_config(len(nv), n_keys, select=select), q_fp8=True)  # integers: rounding exact, exact ties


@pytest.mark.skipif(INTERPRET, reason="prefill-sized batch: slow in the interpreter")
def test_topk_prefill_chunk():
    # A 512-token chunk: counts grow with the position, 1..1024 keys.
    n_keys = 1024
    nv = [(p + 1) // 4 for p in range(3584, 4096)]
    check_topk(topk_case(nv, n_keys, torch.bfloat16, seed=8, integer=True), n_keys, 512, exact=True)


# ------------------------------------------------------------------ capture


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("ratio", [4, 128])
def test_kernels_replay_in_a_cuda_graph(ratio):
    # Captured once on one step's tensors, replayed after every device input changed (positions, rows,
    # picks, counts): the replay equals the torch path on the new inputs. T = 1 (split) and T = 8.
    batch_a = [(i % 4, 50 + 300 * i, 1) for i in range(8)]
    batch_b = [(i % 4, 4000 - 450 * i, 1) for i in range(8)]
    for chunks_a, chunks_b in (([(0, 130, 1)], [(2, 3000, 1)]), (batch_a, batch_b)):
        T, a = attention_case(chunks_a, 64, ratio, torch.bfloat16, seed=11)
        _, b = attention_case(chunks_b, 64, ratio, torch.bfloat16, seed=12)
        tq = topk_case([p // 4 for _, p, _ in chunks_a], 1024, torch.bfloat16, seed=13, integer=True)
        tb = topk_case([p // 4 for _, p, _ in chunks_b], 1024, torch.bfloat16, seed=14, integer=True)
        assert_graph_replay_follows_inputs(T, a, b, tq, tb)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("select", SELECTS)
def test_topk_replays_in_a_cuda_graph_with_new_counts(select):
    # Captured on short contexts, replayed on long ones and back (n_valid, q, w, keys, slot copied in): each
    # replay equals the torch path on its inputs, and replays are deterministic (the fused select's bins
    # are zeroed inside the captured work, so a second replay starts from zero too).
    n_keys, k, T = 9236, 512, 6
    counts = ([0, 100, 512, 513, 1000, 9236], [8192, 9236, 511, 20000, 4097, 513], [1, 2, 3, 600, 700, 8000])
    cases = [topk_case(nv, n_keys, torch.bfloat16, seed=30 + i, integer=True) for i, nv in enumerate(counts)]
    live = [x.clone() for x in cases[0]]
    cfg = _config(T, n_keys, select=select)
    indexer_topk(*live, n_keys, k, config=cfg)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        picks = indexer_topk(*live, n_keys, k, config=cfg)
    for case in cases[1:] + cases[:1]:
        for dst, src in zip(live, case):
            dst.copy_(src)
        g.replay()
        first = picks.clone()
        g.replay()
        assert torch.equal(picks, first), "replays differ"
        ref = torch_path.indexer_topk(*case, n_keys, k)
        assert torch.equal(picks.sort(dim=1).values, ref.sort(dim=1).values)


def _topk_of_case(fn, case: tuple) -> torch.Tensor:
    """fn (the kernel's or the torch path's indexer_topk) on a topk_case (q, w, keys, slot, n_valid), 1024 keys a
    token, K = 512; FP8 keys' cases carry their scales as a sixth element (test_fp8_cache_gpu.fp8_keys)."""
    return fn(*case[:5], 1024, 512, key_scales=case[5] if len(case) > 5 else None)


def assert_graph_replay_follows_inputs(T: int, a: tuple, b: tuple, tq: tuple, tb: tuple) -> None:
    """Capture attention (args a) and top-K (args tq) once, copy b / tb into their tensors, replay: the
    replay equals the torch path on b / tb (64 heads of 512, 1024 keys a token, K = 512)."""
    out = torch.full((T, 64 * 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    sparse_attention_sink(*a, out)  # compile outside the capture
    _topk_of_case(indexer_topk, tq)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_attention_sink(*a, out)
        picks = _topk_of_case(indexer_topk, tq)
    for dst, src in zip(list(a) + list(tq), list(b) + list(tb)):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
        elif isinstance(dst, tuple):  # the RingIndex
            for x, y in zip(dst, src):
                x.copy_(y)
    out.fill_(float("nan"))
    g.replay()
    ref = torch.empty_like(out)
    sparse_attention_torch(*b, ref)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert torch.equal(picks.sort(dim=1).values, _topk_of_case(torch_path.indexer_topk, tb).sort(dim=1).values)
