"""Programmatic dependent launch (`runtime.pdl`) on a GPU: every Triton wrapper of ops/ gives bitwise the same
outputs with pdl=True as with pdl=False, called eagerly and replayed from a CUDA graph, at Flash dims
(ModelConfig's defaults) and decode batches of 1 and 32; and a captured chain of dependent kernels replays
faster with PDL than without, which it can only do if capture kept the programmatic edges
(benchmarks/pdl_edges.py shows the edges themselves: kernel starts overlapping their predecessor's end).

Run on a GPU of compute capability >= 9.0: `pytest -m gpu tests/test_pdl_gpu.py`. Skipped where PDL cannot
run (`ops.kernel_support.pdl_unavailable`): older GPUs, and Triton's interpreter (TRITON_INTERPRET=1), which
runs no inline assembly, so gdc_wait cannot run there; the interpreter still runs every pdl=False path
(the kernel tests).

Equality is exact (torch.equal; FP8 results compared as bytes): with PDL the kernels run the same code on
the same inputs, only their start is earlier, so any difference is a race (a load before the wait) or a
kernel compiled differently. Each call's inputs are first rewritten by a kernel (an elementwise multiply by
one, exact; a copy for bool masks), so every wrapper's first launch follows a kernel that wrote what it reads.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from tp_runtime.config import ModelConfig
from tp_runtime.model.rope import RotaryTable
from tp_runtime.model.step_index import block_index, ring_index
from tp_runtime.ops.cache_fp8 import quantize_keys, quantize_rows, row_bytes
from tp_runtime.ops.compressor_pool import compress_pool
from tp_runtime.ops.index import BlockIndex, RingIndex, RingState, ring_length
from tp_runtime.ops.indexer_topk import indexer_topk
from tp_runtime.ops.kernel_support import pdl_unavailable
from tp_runtime.ops.fp8_gemm import Fp8GemmConfig, fp8_gemm, quantize_x
from tp_runtime.ops.linear import blockwise_scaled_mm_available, linear_triton
from tp_runtime.ops.rms_norm import rms_norm
from tp_runtime.ops.rope import prepare_heads
from tp_runtime.ops.sparse_attention import sparse_attention_sink
from tp_runtime.weights.fp8 import quantize_fp8

WHY = pdl_unavailable(torch.device("cuda")) if torch.cuda.is_available() else "a CUDA GPU"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=f"PDL needs {WHY}")]

DEV = torch.device("cuda")
BF16 = torch.bfloat16
FLASH = ModelConfig()
D, DR, W, H = FLASH.head_dim, FLASH.qk_rope_head_dim, FLASH.sliding_window, FLASH.num_attention_heads
IH, ID, TOPK, EPS = FLASH.index_n_heads, FLASH.index_head_dim, FLASH.index_topk, FLASH.rms_norm_eps
MAX_LEN = 4096
BATCHES = [1, 32]  # decode tokens: T = 1 splits attention over programs; 32 does not


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(dtype)


def _refresh(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src by a kernel, exactly (x * 1 == x, signs of zeros kept; complex as its real pairs)."""
    if dst.is_complex():
        dst, src = torch.view_as_real(dst), torch.view_as_real(src)
    if dst.dtype == torch.bool:
        dst.copy_(src)
    else:
        torch.mul(src, 1, out=dst)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensors as bytes (torch.equal and fill_ may lack float8 kernels); others as they are."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def _poison(t: torch.Tensor) -> None:
    t = _bytes(t)
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(0x55)


def _assert_equal(got: list[torch.Tensor], ref: list[torch.Tensor], what: str) -> None:
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(_bytes(a), _bytes(b)), f"{what}: output {i} differs with pdl=True"


def check_on_off(pristine: list[torch.Tensor], op: Callable[[list[torch.Tensor], bool], list[torch.Tensor]]) -> None:
    """op(inputs, pdl) -> outputs. Its outputs with pdl=True equal those with pdl=False, eagerly and from a
    replayed graph (outputs poisoned before the replay, so the replay must write them). op may work in
    place: its inputs are refreshed from `pristine` before every call."""
    work = [p.clone() for p in pristine]

    def run(pdl: bool) -> list[torch.Tensor]:
        for w, p in zip(work, pristine):
            _refresh(w, p)
        return op(work, pdl)

    ref = [o.clone() for o in run(False)]
    _assert_equal(run(True), ref, "eager")  # also compiles the PDL variants outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = run(True)
    for o in outs:
        _poison(o)
    g.replay()
    torch.cuda.synchronize()
    _assert_equal(outs, ref, "graph replay")


def decode_metadata(T: int, g: torch.Generator, low: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token per sequence: slots 0..T-1 at random positions in [low, MAX_LEN)."""
    return torch.arange(T, device=DEV), torch.randint(low, MAX_LEN, (T,), generator=g, device=DEV)


def decode_ring(R: int, slot: torch.Tensor, pos: torch.Tensor) -> RingIndex:
    return ring_index(R, slot, pos, torch.arange(len(pos), device=DEV), pos, pos, trash=len(pos))


def cis_at(pos: torch.Tensor) -> torch.Tensor:
    return RotaryTable(DR, FLASH.compress_rope_theta, FLASH.rope_scaling, MAX_LEN, DEV).at(pos)


# ------------------------------------------------------------------ one test per wrapper


@pytest.mark.parametrize("T", BATCHES)
@pytest.mark.parametrize("C", [FLASH.hidden_size, FLASH.q_lora_rank, D])  # attn_norm, q_norm, kv_norm
def test_rms_norm(T, C):
    g = torch.Generator(device=DEV).manual_seed(C + T)
    check_on_off([_randn(g, T, C), 1 + _randn(g, C, scale=0.1)], lambda x, pdl: [rms_norm(x[0], x[1], EPS, pdl=pdl)])


@pytest.mark.parametrize("T", BATCHES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads,with_idx", [(H, True), (H // 8, True), (H, False)])  # tp 1, tp 8; window layer
def test_prepare_heads(T, fp8, heads, with_idx):
    g = torch.Generator(device=DEV).manual_seed(T + heads)
    _, pos = decode_metadata(T, g)
    kv_out = torch.zeros(T, row_bytes(D, DR), dtype=torch.uint8, device=DEV) if fp8 else _randn(g, T, D)
    inputs = [_randn(g, T, heads, D, scale=3.0), _randn(g, T, D), kv_out, cis_at(pos), _randn(g, T, IH, ID)]

    def op(x: list[torch.Tensor], pdl: bool) -> list[torch.Tensor]:
        q, kv, out, cis, iq = x
        prepare_heads(q, kv, out, cis, EPS, iq if with_idx else None, pdl=pdl)
        return [q, out, iq]

    check_on_off(inputs, op)


@pytest.mark.parametrize("T", BATCHES)
@pytest.mark.parametrize("ratio,dim,store", [(4, D, "plain"), (128, D, "plain"), (4, D, "row"), (4, ID, "key"),
                                             (4, ID, "plain")])
def test_compress_pool(T, ratio, dim, store):
    g = torch.Generator(device=DEV).manual_seed(ratio + dim + T)
    slot, pos = decode_metadata(T, g)
    pos[: T // 2 + 1] = pos[: T // 2 + 1] // ratio * ratio + ratio - 1  # about half of the tokens complete a block
    R = ring_length(ratio)
    C = R // ratio * dim
    ring, blk = decode_ring(R, slot, pos), block_index(ratio, slot, pos, T, RotaryTable(
        DR, FLASH.compress_rope_theta, FLASH.rope_scaling, MAX_LEN, DEV))
    n = -(-MAX_LEN // ratio)
    nb = {"plain": dim, "row": row_bytes(dim, DR), "key": dim}[store]  # "key": the e4m3 codes
    out = _randn(g, T + 1, n, dim) if store == "plain" else torch.randint(0, 256, (T + 1, n, nb), generator=g,
                                                                          device=DEV, dtype=torch.uint8)
    scales = [_randn(g, T + 1, n, dtype=torch.float32)] if store == "key" else []  # the keys' scales
    wide = _randn(g, T, 2 * C + 8)  # kv and score: column views of one GEMM output
    wide[:, C + 3:2 * C + 3] *= 2.0
    inputs = [wide, _randn(g, ratio, C, scale=0.5, dtype=torch.float32), 1 + _randn(g, dim, scale=0.1),
              _randn(g, T + 1, R, C, dtype=torch.float32), _randn(g, T + 1, R, C, scale=2.0, dtype=torch.float32),
              out, *ring, *blk, *scales]
    n_idx = len(ring) + len(blk)

    def op(x: list[torch.Tensor], pdl: bool) -> list[torch.Tensor]:
        w, ape, weight, skv, ssc, o = x[:6]
        st = RingState(skv, ssc)
        sc = x[6 + n_idx:]  # [the keys' scales] with store "key", else []
        compress_pool(w[:, 3:3 + C], w[:, C + 3:2 * C + 3], ape, weight, EPS, BlockIndex(*x[6 + len(ring):6 + n_idx]),
                      RingIndex(*x[6:6 + len(ring)]), st, o, store, *sc, pdl=pdl)
        return [o, skv, ssc, *sc]

    check_on_off(inputs, op)


@pytest.mark.parametrize("T", BATCHES)
@pytest.mark.parametrize("fp8", [False, True])
def test_indexer_topk(T, fp8):
    g = torch.Generator(device=DEV).manual_seed(T + fp8)
    n_keys = MAX_LEN // 4
    keys = _randn(g, T + 1, n_keys, ID)
    keys = list(quantize_keys(keys)) if fp8 else [keys]  # FP8: e4m3 codes and their scales
    slot = torch.arange(T, device=DEV)
    n_valid = torch.randint(0, n_keys + 1, (T,), generator=g, device=DEV)
    n_valid[0] = n_keys  # the longest context; others below and above K
    inputs = [_randn(g, T, IH, ID), _randn(g, T, IH), keys[0], slot, n_valid, *keys[1:]]

    def op(x: list[torch.Tensor], pdl: bool) -> list[torch.Tensor]:
        return [indexer_topk(*x[:5], n_keys, TOPK, pdl=pdl, key_scales=x[5] if fp8 else None)]

    check_on_off(inputs, op)


@pytest.mark.parametrize("T", BATCHES + [128])  # 128: the many-token regime (the Gluon kernels on Hopper)
@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [H, H // 8])
def test_sparse_attention(T, ratio, fp8, heads):
    g = torch.Generator(device=DEV).manual_seed(T + ratio + heads + fp8)
    slot, pos = decode_metadata(T, g, low=W)

    def rows(*shape: int) -> torch.Tensor:
        x = _randn(g, *shape, D)
        return quantize_rows(x, DR) if fp8 else x

    n_comp = 0 if ratio == 0 else (TOPK if ratio == 4 else MAX_LEN // ratio)
    n_done = (pos + 1) // max(ratio, 1)
    picks = torch.full((T, max(n_comp, 1)), -1, dtype=torch.long, device=DEV)
    if ratio == 4:
        for t in range(T):  # as the indexer leaves them: distinct valid entries first, then -1
            k = min(n_comp, int(n_done[t]))
            picks[t, :k] = torch.randperm(int(n_done[t]), generator=g, device=DEV)[:k]
    ring = decode_ring(W, slot, pos)
    n_rows = -(-MAX_LEN // ratio) if ratio else 1  # the compressed cache (unused by a window-only layer)
    inputs = [_randn(g, T, heads, D, scale=3.0), rows(T), rows(T + 1, W), rows(T + 1, n_rows),
              slot, picks, n_done, _randn(g, heads, dtype=torch.float32), cis_at(pos),
              torch.zeros(T, heads * D, dtype=BF16, device=DEV), *ring]

    def op(x: list[torch.Tensor], pdl: bool) -> list[torch.Tensor]:
        q, kv, win, comp, sl, pk, nd, sink, cis, out = x[:10]
        sparse_attention_sink(q, kv, win, RingIndex(*x[10:]), comp if ratio else None, sl,
                              pk if ratio == 4 else None, nd if ratio else None, n_comp, sink, D ** -0.5, cis, out,
                              pdl=pdl)
        return [out]

    check_on_off(inputs, op)


def _fp8_weight(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8(torch.randn(n, k, generator=g, device=DEV) / k ** 0.5)


# (N, K per group, groups) of Flash's FP8 GEMMs at tp 1: wq_a + wkv, wq_b, wo_a (grouped), wo_b
LINEAR_SHAPES = [(FLASH.q_lora_rank + D, FLASH.hidden_size, 1), (H * D, FLASH.q_lora_rank, 1),
                 (FLASH.o_groups * FLASH.o_lora_rank, H * D // FLASH.o_groups, FLASH.o_groups),
                 (FLASH.hidden_size, FLASH.o_groups * FLASH.o_lora_rank, 1)]


@pytest.mark.parametrize("M", [1, 8])  # the GEMV kernel; the tile kernel (both split K at these sizes)
@pytest.mark.parametrize("n,k,groups", LINEAR_SHAPES)
def test_linear_triton(M, n, k, groups):
    g = torch.Generator(device=DEV).manual_seed(n + k + M)
    qw, scale = _fp8_weight(n, k, g)
    inputs = [_randn(g, M, groups * k)]
    check_on_off(inputs, lambda x, pdl: [linear_triton(x[0], qw, scale, groups, pdl=pdl)])


def test_fp8_gemm_family():
    g = torch.Generator(device=DEV).manual_seed(5)
    x = [_randn(g, 64, FLASH.hidden_size, scale=4.0)]
    check_on_off(x, lambda x, pdl: list(quantize_x(x[0], pdl)))
    qw, scale = _fp8_weight(FLASH.q_lora_rank + D, FLASH.hidden_size, g)
    for quant_x in (True, False):  # rounding in the prologue, or one quantize launch first; split K
        c = Fp8GemmConfig("triton", 64, 128, 4, 4, 3, quant_x)
        check_on_off(x, lambda x, pdl: [fp8_gemm(x[0], qw, scale, 1, c, pdl=pdl)])
    c = Fp8GemmConfig("gemv", 1, 16, 4, 4, 3, True, 512)  # M = 1: the GEMV, rounding x in its K loop
    check_on_off([x[0][:1]], lambda x, pdl: [fp8_gemm(x[0], qw, scale, 1, c, pdl=pdl)])
    if blockwise_scaled_mm_available(DEV):  # quantize (Triton, PDL) then cuBLASLt (no PDL)
        c = Fp8GemmConfig("scaled_mm", 0, 0, 1, 0, 0, False)
        check_on_off(x, lambda x, pdl: [fp8_gemm(x[0], qw, scale, 1, c, pdl=pdl)])


# ------------------------------------------------------------------ PDL edges survive capture

CHAIN = 200  # dependent launches per graph


def chain_graph(x: torch.Tensor, w: torch.Tensor, pdl: bool) -> torch.cuda.CUDAGraph:
    """CHAIN RMSNorms, each reading the previous one's output, captured in one graph."""
    rms_norm(x, w, EPS, pdl=pdl)  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(CHAIN):
            y = rms_norm(y, w, EPS, pdl=pdl)
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, n: int = 20) -> float:
    """Microseconds per kernel of `n` back-to-back replays."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (n * CHAIN)


def test_captured_chain_replays_faster_with_pdl():
    # Measured on an H200: a graph of dependent one-program Triton kernels costs ~0.9 us a kernel plain and
    # ~0.6 us with PDL (benchmarks/pdl_edges.py prints both for this chain). A graph that lost the programmatic
    # edges replays as the plain one does; 0.9x leaves a wide margin for noise and still fails then. Medians
    # over interleaved rounds, so clock changes hit both alike.
    x = torch.randn(1, D, device=DEV, dtype=BF16)
    w = torch.ones(D, device=DEV, dtype=BF16)
    graphs = {pdl: chain_graph(x, w, pdl) for pdl in (False, True)}
    for gr in graphs.values():
        replay_us(gr, 5)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(15):
        for pdl, gr in graphs.items():
            times[pdl].append(replay_us(gr))
    off, on = (sorted(times[p])[len(times[p]) // 2] for p in (False, True))
    assert on < 0.9 * off, f"per kernel: {on:.3f} us with PDL, {off:.3f} us without"
