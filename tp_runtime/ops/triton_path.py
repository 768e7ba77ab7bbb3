"""The Triton kernel backend: every stage-B method of `ops/torch_path.py`'s TorchBackend, launched as the
fused Triton kernels of tp_runtime/ops/ (one file per kernel family), with the same arguments and meaning.

    rms_norm          ops/rms_norm.py          one launch for T rows
    heads             ops/rope.py              q norm + rotary, kv rotary (+ FP8 row), indexer-query rotary
    rotary            ops/rope.py              the indexer query alone (the overlapped schedule's side branch)
    compress          ops/compressor_pool.py   pool + norm + rotary + store, then the state rings (two launches)
    indexer_topk      ops/indexer_topk.py      scores (counting first-digit bins) + a radix-select top-K over runs
                                               of each token's scores (two launches after a memset of the bins);
                                               with q_fp8 and FP8 keys the scores are FP8 dots; FP8 keys and
                                               a 16-bit q on Hopper: ops/indexer_scores_wgmma.py's scores
    sparse_attention  ops/sparse_attention.py  split attention with sink + inverse rotary, then the combine
    fp8_linear        ops/fp8_gemm.py          FP8 weight GEMMs, x rounded to e4m3 (launch by the tuning table,
                                               ops/fp8_gemm_table.py); x as given: ops/linear.py
    linear            ops/gemv.py              bf16 weight GEMMs (optionally behind an RMSNorm of x): the Triton
                                               GEMV where it beat cuBLAS, else cuBLAS
    add_rms_norm      ops/add_rms_norm.py      a layer's residual add + the next layer's attn_norm, one launch
                                               (_rounded: x also rounded to e4m3 for the next layer's FP8 GEMM)
    rms_norm_pair     ops/rms_norm_pair.py     q_norm and kv_norm, one launch (_rounded: q_norm's output also rounded
                                               to e4m3 for the FP8 GEMMs that read it, sparing their quantize launch)
    step_index        ops/step_index.py        every tensor of the per-step index, one launch

CUDA only (bf16 / fp16 / fp32), chosen by `ops/select.py`. Building one needs no GPU: nothing launches
until a method is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tp_runtime.ops.add_rms_norm import add_rms_norm, add_rms_norm_rounded
from tp_runtime.ops.cache_fp8 import row_bytes
from tp_runtime.ops.compressor_pool import compress_pool
from tp_runtime.ops.index import BlockIndex, RingIndex, RingState
from tp_runtime.ops.indexer_topk import indexer_topk
from tp_runtime.ops.gemv import gemv, use_triton_gemv
from tp_runtime.ops.act_quant import RoundedX
from tp_runtime.ops.fp8_gemm import fp8_gemm, takes_rounded_x
from tp_runtime.ops.fp8_gemm_table import Fp8GemmTable
from tp_runtime.ops.kernel_support import sm_count
from tp_runtime.ops.linear import fp8_linear
from tp_runtime.ops.rms_norm import rms_norm
from tp_runtime.ops.rms_norm_pair import rms_norm_pair, rms_norm_pair_rounded
from tp_runtime.ops.rope import prepare_heads
from tp_runtime.ops.sparse_attention import sparse_attention_sink
from tp_runtime.ops.step_index import step_index


@dataclass(frozen=True)
class TritonBackend:
    """pdl: launch each kernel with programmatic dependent launch (resolved once, `ops/select.py`);
    fp8_table: the FP8 GEMMs' launches by shape and M, read once when the backend is built."""

    name: ClassVar[str] = "triton"
    pdl: bool = False
    fp8_table: Fp8GemmTable = field(default_factory=Fp8GemmTable.load, compare=False, repr=False)
    _rounds_ahead: dict = field(default_factory=dict, compare=False, repr=False)  # rounds_x_ahead's answers

    def _kw(self) -> dict:
        """The launch options every kernel wrapper below receives, in this one place: {"pdl": True} with
        programmatic dependent launch on, else nothing (so wrappers that predate the keyword keep working)."""
        return {"pdl": True} if self.pdl else {}

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps, **self._kw())

    def add_rms_norm(self, h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(h, y, weight, eps, **self._kw())

    def add_rms_norm_rounded(self, h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        return add_rms_norm_rounded(h, y, weight, eps, **self._kw())

    def rms_norm_pair(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm_pair(a, wa, b, wb, eps, **self._kw())

    def rms_norm_pair_rounded(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        return rms_norm_pair_rounded(a, wa, b, wb, eps, **self._kw())

    def rounds_x_ahead(self, x: torch.Tensor, shapes: list[tuple[int, int]]) -> bool:
        """Whether an FP8 GEMM of these [N, K] weights at x's rows takes x rounded by its producer: its table
        launch would otherwise round x by a quantize_x launch of its own (ops/fp8_gemm.py `takes_rounded_x`).
        Asked per layer and step on the host: answers are kept per (rows, shapes, dtype, device)."""
        m = x.numel() // x.shape[-1]
        key = (m, tuple(tuple(s) for s in shapes), x.dtype, x.device)
        if key not in self._rounds_ahead:
            n_sm = sm_count(x.device)
            self._rounds_ahead[key] = any(takes_rounded_x(self.fp8_table.config(m, n, k, 1, x, n_sm), k)
                                          for n, k in shapes)
        return self._rounds_ahead[key]

    def linear(self, x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
               eps: float = 0.0) -> torch.Tensor:
        """x [M, K] @ weight [N, K]^T, behind RMSNorm(x) * norm_weight where given: the Triton GEMV at the shapes
        of ops/gemv.py's tables (the norm as its prologue; it takes part in PDL), else cuBLAS (after the norm
        kernel). M is the capture size or the eager batch, fixed per graph: no branch on a step's values."""
        norm = norm_weight is not None
        if x.dim() == 2 and x.stride(-1) == 1 and use_triton_gemv(x.shape[0], *weight.shape, norm=norm):
            return gemv(x, weight, norm_weight, eps, **self._kw())
        return torch.nn.functional.linear(self.rms_norm(x, norm_weight, eps) if norm else x, weight)

    @staticmethod
    def linear_stream_safe(m: int, n: int, k: int) -> bool:
        """cuBLAS's GEMMs are; the Triton GEMV's are not (its split-K counters are the device's, ops/linear.py)."""
        return not use_triton_gemv(m, n, k)

    @staticmethod
    def norm_prologue(m: int, shapes: list[tuple[int, int]]) -> bool:
        """Whether every GEMM of `shapes` ([N, K] weights) at m rows takes the RMSNorm of its x as the GEMV's
        prologue (ops/gemv.py's norm table), so the normed x need never be written."""
        return all(use_triton_gemv(m, n, k, norm=True) for n, k in shapes)

    def heads(self, q: torch.Tensor, kv: torch.Tensor, cis: torch.Tensor, eps: float, kv_dtype: torch.dtype,
              idx_q: torch.Tensor | None = None, ring: tuple[torch.Tensor, "RingIndex"] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """torch_path.heads in one launch: q and idx_q (the projections' own buffers) rotated in place, kv
        into a new buffer of kv_dtype (uint8: FP8 rows, quantized in the kernel) and, with ring, into the
        window ring's write rows by the same programs."""
        T, D = kv.shape
        width = row_bytes(D, 2 * cis.shape[-1]) if kv_dtype == torch.uint8 else D
        kv_out = torch.empty(T, width, dtype=kv_dtype, device=kv.device)
        rows = (ring[0], ring[1].write_row) if ring is not None else None
        prepare_heads(q, kv, kv_out, cis, eps, idx_q, rows, **self._kw())
        return q, kv_out, idx_q

    def rotary(self, x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
        """x [T, H, Dh] (a projection's own buffer) roped in place on its last Dr dims, by prepare_heads with no
        query heads: its one kv program per token turns a scratch row [T, Dr] nobody reads (the wrapper
        always rotates a kv row; a rotary-only wrapper would save those T small programs)."""
        T, dr = x.shape[0], 2 * cis.shape[-1]
        scratch = torch.empty(T, dr, dtype=x.dtype, device=x.device)
        prepare_heads(x.new_empty(T, 0, dr), scratch, scratch, cis, 0.0, x, **self._kw())
        return x

    def compress(self, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, weight: torch.Tensor, eps: float,
                 blk: "BlockIndex", ring: "RingIndex", state: "RingState", out: torch.Tensor,
                 store: str = "plain", scales: torch.Tensor | None = None) -> None:
        compress_pool(kv, score, ape, weight, eps, blk, ring, state, out, store, scales, **self._kw())

    def indexer_topk(self, q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor,
                     n_valid: torch.Tensor, n_keys: int, k: int, q_fp8: bool = False,
                     key_scales: torch.Tensor | None = None) -> torch.Tensor:
        return indexer_topk(q, w, keys, slot, n_valid, n_keys, k, q_fp8=q_fp8, key_scales=key_scales, **self._kw())

    def sparse_attention(self, q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, ring: "RingIndex",
                         compressed: torch.Tensor | None, slot: torch.Tensor, picks: torch.Tensor | None,
                         n_done: torch.Tensor | None, n_comp: int, sink: torch.Tensor, scale: float,
                         cis: torch.Tensor, out: torch.Tensor) -> None:
        sparse_attention_sink(q, kv, window, ring, compressed, slot, picks, n_done, n_comp, sink, scale, cis, out,
                              **self._kw())

    def fp8_linear(self, x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1,
                   round_x: bool = False, rounded: RoundedX | None = None) -> torch.Tensor:
        if not round_x:
            return fp8_linear(x, qw, scale, groups, **self._kw())
        m = x.numel() // x.shape[-1]
        c = self.fp8_table.config(m, qw.shape[0], qw.shape[1], groups, x, sm_count(x.device))
        return fp8_gemm(x, qw, scale, groups, c, rounded=rounded, **self._kw())

    def step_index(self, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
                   last_pos: torch.Tensor, trash: int, rings: Mapping[int, Sequence[torch.Tensor]],
                   angles: Sequence[tuple[torch.Tensor, torch.Tensor]], blocks: Mapping[int, Sequence[torch.Tensor]],
                   block_table: torch.Tensor | None) -> None:
        step_index(slot, pos, start_idx, start_pos, last_pos, trash, rings, angles, blocks, block_table,
                   **self._kw())
