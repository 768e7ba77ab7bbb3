"""The compressor's Triton kernels (ops/compressor_pool.py) against the torch path, on random inputs.

Run on a GPU machine: `pytest -m gpu tests/test_compressor_kernel_gpu.py`. Where Triton is installed
without a GPU, `TRITON_INTERPRET=1 pytest -m gpu tests/test_compressor_kernel_gpu.py` runs the same checks
(smaller cases, fp32 only) on the CPU through Triton's interpreter: indexing and masking, not the compiled code.

Both paths get the same inputs (stage A's projections as column views of a wider GEMM output), the same
state rings and the same prior cache contents; checked are every non-trash slot of the compressed cache
and of both state rings. The trash slot is not compared: the torch path writes the entries of tokens
that complete no block there, the kernel leaves it alone.

Tolerances (relative error of each cache row, ||a - b|| / ||b||):
- entries: both paths start from bit-identical fp32 values (kv, and score + ape, one fp32 add on each
  path), pool, normalize and rotate in fp32 and round once into the cache's dtype. The fp32 results
  differ only by summation order and exp / rsqrt implementations: ~1e-6 relative (2e-5 for an fp32
  cache). Rounded into bf16 (fp16) the same value up to that difference becomes the same number or one
  ulp apart, at most 2^-7 (2^-10) relative: 1e-2 (2e-3). A wrong row, phase or mask moves an entry far
  more: one row of the 8 or 128 pooled changes it by ~1/sqrt(R) >= 0.09 relative.
- state rings: kv and score + ape are stored by the same single fp32 operation on both paths: equal.
"""

from __future__ import annotations


import pytest
import torch
from conftest import INTERPRET, KERNEL_DEVICE, KERNEL_MARKS

from tp_runtime.config import ModelConfig
from tp_runtime.model.batch import StepBatch
from tp_runtime.model.compressor import Compressor
from tp_runtime.model.rope import RotaryTable
from tp_runtime.model.step_index import block_index, ring_index
from tp_runtime.ops.index import RingState, StepIndex, ring_length
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.ops.triton_path import TritonBackend

triton = pytest.importorskip("triton")

pytestmark = KERNEL_MARKS
DEV = KERNEL_DEVICE

FLASH = ModelConfig()  # the released Flash dims are the defaults
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-5}
# Triton's interpreter stands in for the GPU in fp32 only (numpy has no bf16).
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16, torch.float32]
MAX_LEN = 4096


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(0, -2), b.double().flatten(0, -2)
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max())


def step_batch(chunks: list[tuple[int, int, int]], n_pad: int, ratio: int, trash: int,
               dr: int = FLASH.qk_rope_head_dim) -> StepBatch:
    """A step of chunks (slot, first position, length), then n_pad padding tokens (trash slot, position 0,
    a chunk of their own, as engine.buffers lays them out), with the index of one compressor."""
    rows: list[list[int]] = [[], [], [], [], []]
    i = 0
    for slot, start, length in chunks:
        for r, v in zip(rows, ([slot] * length, range(start, start + length), [i] * length, [start] * length,
                               [start + length - 1] * length)):
            r += v
        i += length
    for _ in range(n_pad):
        for r, v in zip(rows, (trash, 0, i, 0, 0)):
            r.append(v)
        i += 1
    slot, pos, start_idx, start_pos, last_pos = torch.tensor(rows, dtype=torch.long, device=DEV)
    table = RotaryTable(dr, FLASH.compress_rope_theta, FLASH.rope_scaling, MAX_LEN, DEV)
    R = ring_length(ratio)
    ix = StepIndex({R: ring_index(R, slot, pos, start_idx, start_pos, last_pos, trash)}, {},
                   {ratio: block_index(ratio, slot, pos, trash, table)})
    return StepBatch(torch.empty(i, 1, device=DEV), slot, pos, start_idx, start_pos, last_pos, i,
                     int(pos.max()), ix)


class Case:
    """A torch and a Triton compressor with the same parameters, and caches of `slots` slots + trash."""

    def __init__(self, ratio: int, D: int, dtype: torch.dtype, slots: int, seed: int,
                 dr: int = FLASH.qk_rope_head_dim):
        self.g = torch.Generator(device=DEV).manual_seed(seed)
        self.ratio, self.D, self.dtype, self.trash, self.dr = ratio, D, dtype, slots, dr
        self.mods = [Compressor(ratio, D, FLASH.rms_norm_eps, dtype, DEV, b) for b in (TorchBackend(), TritonBackend())]
        ape = self.randn(*self.mods[0].ape.shape, scale=0.5)
        w = 1 + self.randn(D, scale=0.1)
        for m in self.mods:
            m.ape.copy_(ape)
            m.norm.weight.copy_(w)
        R, C = ring_length(ratio), self.mods[0].ape.shape[1]
        # random history in every slot: rings as an earlier step left them, entries already emitted
        st = RingState(self.randn(slots + 1, R, C), self.randn(slots + 1, R, C, scale=2.0))
        out = self.randn(slots + 1, -(-MAX_LEN // ratio), D).to(dtype)
        self.states = [RingState(st.kv.clone(), st.score.clone()) for _ in self.mods]
        self.outs = [out.clone() for _ in self.mods]

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g, device=DEV) * scale

    def inputs(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """kv, score [T, C] in the run dtype: column views of one wider GEMM output, as stage A gives them."""
        C = self.mods[0].ape.shape[1]
        wide = self.randn(T, 3 + 2 * C + 5)
        wide[:, 3 + C:3 + 2 * C] *= 2.0  # scores of a few units: softmaxes neither flat nor one-hot
        wide = wide.to(self.dtype)
        return wide[:, 3:3 + C], wide[:, 3 + C:3 + 2 * C]

    def step(self, chunks: list[tuple[int, int, int]], n_pad: int = 0) -> int:
        """Run both compressors on one step; compare; return how many entries it emitted."""
        b = step_batch(chunks, n_pad, self.ratio, self.trash, self.dr)
        kv, score = self.inputs(len(b.pos))
        for m, st, out in zip(self.mods, self.states, self.outs):
            m(kv, score, b, st, out)
        (ref, got), (sr, sg) = self.outs, self.states
        t = self.trash
        assert rel_err(got[:t], ref[:t]) < TOL[self.dtype], rel_err(got[:t], ref[:t])
        assert torch.equal(sg.kv[:t], sr.kv[:t]) and torch.equal(sg.score[:t], sr.score[:t])
        return int((b.ix.blocks[self.ratio].emit_slot != t).sum())


RATIO_DIMS = [(4, 512), (4, 128), (128, 512), (128, 128)]
# Around the 4- and 128-token block edges; 3: the first ratio-4 entry (block -1 counts -inf); 0: nothing.
DECODE_POS = [0, 1, 3, 4, 5, 7, 126, 127, 128, 129, 255, 1023, 4095]


@pytest.mark.parametrize("ratio,D", RATIO_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode(ratio, D, dtype):
    # One token per sequence at each position, then padding; then the next token of every sequence.
    case = Case(ratio, D, dtype, slots=len(DECODE_POS), seed=ratio + D)
    n = case.step([(i, p, 1) for i, p in enumerate(DECODE_POS)], n_pad=3)
    assert n == sum((p + 1) % ratio == 0 for p in DECODE_POS)
    case.step([(i, p + 1, 1) for i, p in enumerate(DECODE_POS[:-1])], n_pad=1)


def prefill_chunks() -> list[list[tuple[int, int, int]]]:
    """One sequence from position 0; two sequences, the second mid-sequence and ending mid-block."""
    if INTERPRET:
        return [[(0, 0, 256)], [(0, 0, 130), (1, 201, 70)]]
    return [[(0, 0, 512)], [(0, 0, 256), (1, 201, 299)], [(0, 1000, 517), (1, 3, 1), (2, 127, 300)]]


@pytest.mark.parametrize("ratio,D", RATIO_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_chunks(ratio, D, dtype):
    for i, chunks in enumerate(prefill_chunks()):
        case = Case(ratio, D, dtype, slots=4, seed=i)
        assert case.step(chunks, n_pad=5) > 0


@pytest.mark.parametrize("ratio,D", RATIO_DIMS)
def test_chunk_after_chunk(ratio, D):
    # The state an earlier chunk left (each path its own) feeds the next chunk and a decode step.
    n = 150 if INTERPRET else 300
    case = Case(ratio, D, DTYPES[0], slots=2, seed=5)
    case.step([(0, 0, n), (1, 0, 1)])
    case.step([(0, n, n), (1, 1, 3)], n_pad=2)
    case.step([(0, 2 * n, 1), (1, 4, 1)], n_pad=2)


def test_tiny_dims():
    # tiny.yaml's compressors (D = 32 and indexer 16, Dr = 8): rows narrower than a rotary block.
    for ratio, D in ((4, 32), (4, 16), (128, 32)):
        case = Case(ratio, D, DTYPES[0], slots=2, seed=9, dr=8)
        case.step([(0, 0, 260), (1, 3, 1)], n_pad=1)


@pytest.mark.skipif(INTERPRET, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("ratio,D", [(4, 512), (128, 512), (4, 128)])
def test_capture_replays(ratio, D):
    # Captured on one step's buffers, replayed on another step's contents: the same caches as the torch path.
    dtype = torch.bfloat16
    a, b = Case(ratio, D, dtype, slots=4, seed=1), Case(ratio, D, dtype, slots=4, seed=2)
    chunks_a = [(0, 126, 1), (1, 3, 1), (2, 0, 1), (3, 4000, 1)]
    chunks_b = [(0, 127, 1), (1, 7, 1), (2, 255, 1), (3, 4093, 1)]
    ba, bb = step_batch(chunks_a, 4, ratio, 4), step_batch(chunks_b, 4, ratio, 4)
    kv, score = a.inputs(len(ba.pos))
    kv_b, score_b = b.inputs(len(bb.pos))
    mod, st, out = a.mods[1], a.states[1], a.outs[1]
    mod(kv, score, ba, st, out)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod(kv, score, ba, st, out)
    for m in b.mods:  # the replay runs with a's parameters: give b's torch module the same
        m.load_state_dict(mod.state_dict())
    kv.copy_(kv_b)
    score.copy_(score_b)
    for dst, src in zip(ba.ix.tensors(), bb.ix.tensors()):
        dst.copy_(src)
    for x, y in ((st.kv, b.states[0].kv), (st.score, b.states[0].score), (out, b.outs[0])):
        x.copy_(y)
    g.replay()
    b.mods[0](kv_b, score_b, bb, b.states[0], b.outs[0])
    t = 4
    assert rel_err(out[:t], b.outs[0][:t]) < TOL[dtype]
    assert torch.equal(st.kv[:t], b.states[0].kv[:t]) and torch.equal(st.score[:t], b.states[0].score[:t])
