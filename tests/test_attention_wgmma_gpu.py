"""The Gluon attention kernels (ops/sparse_attention_wgmma.py; ops/sparse_attention_ws_wgmma.py, FP8 rows) against
the torch twin, on random inputs.

Hopper only (warpgroup MMAs; Triton's interpreter does not run Gluon): elsewhere every test here is skipped
with that reason. The cases are those of tests/test_kernels_gpu.py (its helpers build them), in bf16, with the
rows in bf16 and as FP8 bytes (tests/test_fp8_cache_gpu.py's cases: the kernel decodes them exactly, as the twin
does).

Tolerance: test_kernels_gpu's bf16 one (1e-2 relative error of a token's row): both paths accumulate in fp32
from bf16 rows and round o to bf16 before the inverse rotary; the kernel also feeds P to the second product
in bf16 (~2^-9 relative a weight), so rows differ by ~3e-3, while a dropped or extra candidate among up to 640
moves a row by ~1e-1.
"""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_DEVICE, KERNEL_MARKS
from test_fp8_cache_gpu import fp8_attention_case
from test_kernels_gpu import DECODE_POS, PICK_PATTERNS, TOL, attention_case, padded_picks_case, rel_err, run_both

from tp_runtime.ops.sparse_attention import WGMMA, WGMMA_WS, attn_config
from tp_runtime.ops.kernel_support import gluon_hopper

DEV = KERNEL_DEVICE
pytestmark = KERNEL_MARKS + [pytest.mark.skipif(not gluon_hopper(DEV),
                                                reason="the wgmma attention kernel needs a Hopper GPU and Gluon")]
BF16 = torch.bfloat16
# every shape of tile ring the kernel compiles for with 64 heads: 64 rows x 2 stages (attn_config's), 32 rows x 3
# and 4; with the heads on N (up to FEW_HEADS: 8 and 16 heads) 64-row tiles, heads_n_stages deep, whatever the
# config
CONFIGS = [WGMMA, WGMMA._replace(block_n=32, num_stages=3), WGMMA._replace(block_n=32, num_stages=4)]


ROWS = {"bf16": attention_case, "fp8": fp8_attention_case}


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"n{c.block_n}s{c.num_stages}")
@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("n_heads", [64, 32, 16, 8])
def test_wgmma_attention_decode(rows, config, ratio, n_heads):
    # One decode token per sequence at every context of DECODE_POS (window edges, 4- and 128-token block edges,
    # position 0: one valid window row, no compressed entry), in one launch.
    chunks = [(i % 4, p, 1) for i, p in enumerate(DECODE_POS)]
    T, args = ROWS[rows](chunks, n_heads, ratio, BF16, seed=17)
    out, ref = run_both(T, args, n_heads, config=config)
    assert rel_err(out, ref) < TOL[BF16], rel_err(out, ref)


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_wgmma_attention_prefill_chunks(rows, ratio):
    # Chunks whose window rows come from the step's own rows and from the ring; one that starts mid-window,
    # one from position 0, one decode token, one long chunk at 3000 (512 picks a token at ratio 4).
    chunks = [(0, 200, 300), (1, 0, 256), (2, 1000, 1), (3, 3000, 512)]
    T, args = ROWS[rows](chunks, 64, ratio, BF16, seed=7)
    out, ref = run_both(T, args, 64, config=WGMMA)
    assert rel_err(out, ref) < TOL[BF16]


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("n_cand", [1, 7, 64, 512])
@pytest.mark.parametrize("pattern", list(PICK_PATTERNS))
def test_wgmma_attention_candidate_counts_and_padding(rows, n_cand, pattern):
    # 1, 7, 64 and 512 picks behind the 128 window rows under every -1 pattern (16 heads: on the MMA's N). A -1
    # pick reads the token's own row and weighs 0.
    T, args = padded_picks_case(n_cand, pattern, BF16, case=ROWS[rows])
    out, ref = run_both(T, args, 16, config=WGMMA)
    assert rel_err(out, ref) < TOL[BF16], (n_cand, pattern, rel_err(out, ref))


def test_wgmma_attention_fp16_rows():
    # The kernel's other 16-bit row format.
    T, args = attention_case([(0, 700, 1), (1, 3000, 1), (2, 4, 1)], 64, 4, torch.float16, seed=5)
    out, ref = run_both(T, args, 64, config=WGMMA)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("n_heads", [64, 32, 16, 8])
def test_ws_attention_decode(ratio, n_heads):
    # The warp-specialized kernel (FP8 rows) at every decode edge of DECODE_POS, heads padded to 64: tiles of
    # 2-10 a token, so both ring slots turn over several times, and a last tile partly filled.
    chunks = [(i % 4, p, 1) for i, p in enumerate(DECODE_POS)]
    T, args = fp8_attention_case(chunks, n_heads, ratio, BF16, seed=17)
    out, ref = run_both(T, args, n_heads, config=WGMMA_WS)
    assert rel_err(out, ref) < TOL[BF16], rel_err(out, ref)


@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_ws_attention_prefill_chunks(ratio):
    # Prefill chunks (window rows from the step's own rows and the ring, a chunk from position 0, 512 picks)
    chunks = [(0, 200, 300), (1, 0, 256), (2, 1000, 1), (3, 3000, 512)]
    T, args = fp8_attention_case(chunks, 64, ratio, BF16, seed=7)
    out, ref = run_both(T, args, 64, config=WGMMA_WS)
    assert rel_err(out, ref) < TOL[BF16]


@pytest.mark.parametrize("n_cand", [1, 7, 64, 512])
@pytest.mark.parametrize("pattern", list(PICK_PATTERNS))
def test_ws_attention_candidate_counts_and_padding(n_cand, pattern):
    # 1, 7, 64 and 512 picks behind the window rows under every -1 pattern: a -1 pick weighs 0.
    T, args = padded_picks_case(n_cand, pattern, BF16, case=fp8_attention_case)
    out, ref = run_both(T, args, 16, config=WGMMA_WS)
    assert rel_err(out, ref) < TOL[BF16], (n_cand, pattern, rel_err(out, ref))


def test_attn_config_picks_wgmma_for_many_tokens():
    # The many-token regime (decode at batch 128, prefill chunks) takes a Gluon kernel where it fits (FP8 rows:
    # the warp-specialized one); fewer tokens and fp32 keep the Triton kernel.
    assert attn_config(128, 64, 640, 512, 132, wgmma=True) == WGMMA
    assert attn_config(128, 64, 640, 512, 132, fp8=True, wgmma=True) == WGMMA_WS
    assert attn_config(128, 32, 640, 512, 132, fp8=True, wgmma=True) == WGMMA_WS
    assert attn_config(128, 8, 640, 512, 132, fp8=True, wgmma=True) == WGMMA  # few heads: on the MMA's N
    assert attn_config(2048, 8, 640, 512, 132, wgmma=True) == WGMMA
    assert attn_config(8, 64, 640, 512, 132, wgmma=True).kernel == "triton"
    assert attn_config(128, 64, 640, 512, 132, wgmma=False).kernel == "triton"
    # default (no config): the kernel runs where attn_config picks it and matches the twin
    T, args = attention_case([(i, 3000 + i, 1) for i in range(128)], 64, 4, BF16, seed=3, slots=128)
    out, ref = run_both(T, args, 64)
    assert rel_err(out, ref) < TOL[BF16]
    T, args = fp8_attention_case([(i, 3000 + i, 1) for i in range(128)], 64, 4, BF16, seed=3, slots=128)
    out, ref = run_both(T, args, 64)
    assert rel_err(out, ref) < TOL[BF16]
