"""The kernel backend of a shard: `runtime.kernels` resolved once for its device and dtype, into one object.

    torch   TorchBackend (ops/torch_path.py): the torch twins, the semantics (any device, any dtype)
    triton  TritonBackend (ops/triton_path.py): the fused kernels of tp_runtime/ops/ (CUDA, bf16 / fp16 / fp32)
    auto    triton on a CUDA device when Triton imports and the dtype is not float64, else torch

Both classes have the methods of `KernelBackend`, with the same signatures and meaning. The stack is built
with one backend object and hands it to every layer; the layers call its methods and never branch on its
name (a report names it: `backend.name`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from tp_runtime.capability import kernels_refusal, triton_unavailable
from tp_runtime.config_yaml import ConfigError
from tp_runtime.ops.act_quant import RoundedX
from tp_runtime.ops.index import BlockIndex, RingIndex, RingState
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.ops.triton_path import TritonBackend


CHOICES = ("torch", "triton")
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class KernelBackend(Protocol):
    """What a layer asks of its kernels. Shapes: T tokens, Hl local heads of D dims, Dr rotary dims."""

    name: str  # "torch" | "triton"
    pdl: bool  # kernels launched with programmatic dependent launch (Triton only)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """x [T, C] -> RMSNorm(x) * weight in x's dtype (fp32 math)."""

    def add_rms_norm(self, h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """h, y [T, C] -> (h + y, RMSNorm(h + y) * weight): a residual add and the next layer's attn_norm."""

    def rms_norm_pair(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """a [T, Ca], b [T, Cb] -> (RMSNorm(a) * wa, RMSNorm(b) * wb): q_norm and kv_norm together."""

    def add_rms_norm_rounded(self, h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        """add_rms_norm, and x rounded to e4m3 per 1 x 128 block (ops/act_quant.py's RoundedX) for the next
        layer's FP8 GEMM of x."""

    def rms_norm_pair_rounded(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor, RoundedX]:
        """rms_norm_pair, and its first output rounded to e4m3 per 1 x 128 block (ops/act_quant.py's RoundedX)
        for the FP8 GEMMs that read it."""

    def rounds_x_ahead(self, x: torch.Tensor, shapes: list[tuple[int, int]]) -> bool:
        """Whether an FP8 GEMM (x rounded) of these [N, K] weights at x's rows is spared work when x comes
        rounded by its producer (`fp8_linear`'s rounded)."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
               eps: float = 0.0) -> torch.Tensor:
        """x [M, K] @ weight [N, K]^T for weights in the run dtype, behind RMSNorm(x) * norm_weight if given."""

    def norm_prologue(self, m: int, shapes: list[tuple[int, int]]) -> bool:
        """Whether GEMMs of these [N, K] weights at m rows should each take x's RMSNorm as their prologue
        (rather than one norm launch whose output they all read)."""

    def linear_stream_safe(self, m: int, n: int, k: int) -> bool:
        """Whether `linear` at m rows of an [n, k] weight keeps no state shared with other launches (the
        Triton GEMMs' split-K counters), so that it may run on a second stream beside them."""

    def heads(self, q: torch.Tensor, kv: torch.Tensor, cis: torch.Tensor, eps: float, kv_dtype: torch.dtype,
              idx_q: torch.Tensor | None = None, ring: tuple[torch.Tensor, "RingIndex"] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q [T, Hl, D] normed + roped, kv [T, D] roped into kv_dtype, idx_q roped; with ring = (window,
        RingIndex) kv's rows also stored into the window ring (torch_path.heads)."""

    def rotary(self, x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
        """x [T, H, Dh] roped on its last Dr dims by cis [T, Dr/2]."""

    def compress(self, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, weight: torch.Tensor, eps: float,
                 blk: "BlockIndex", ring: "RingIndex", state: "RingState", out: torch.Tensor,
                 store: str = "plain", scales: torch.Tensor | None = None) -> None:
        """A compressor's stage B: completed entries into out (store "key": FP8 keys' e4m3 codes, their fp32
        scales into scales [slots + 1, N]), the step's rows into the state rings."""

    def indexer_topk(self, q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, slot: torch.Tensor,
                     n_valid: torch.Tensor, n_keys: int, k: int, q_fp8: bool = False,
                     key_scales: torch.Tensor | None = None) -> torch.Tensor:
        """The top-k indexer keys per token [T, min(k, n_keys)], -1 where none; q_fp8: scored with each head's q
        rounded to e4m3 as a key is stored (runtime.indexer_q=e4m3); key_scales fp32 [slots, N]: the scales of
        FP8 keys (uint8 e4m3 codes [slots, N, Id]), None with keys in a float dtype."""

    def sparse_attention(self, q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, ring: "RingIndex",
                         compressed: torch.Tensor | None, slot: torch.Tensor, picks: torch.Tensor | None,
                         n_done: torch.Tensor | None, n_comp: int, sink: torch.Tensor, scale: float,
                         cis: torch.Tensor, out: torch.Tensor) -> None:
        """Attention with sink over window and compressed rows, inverse rotary, into out [T, Hl*D]."""

    def fp8_linear(self, x: torch.Tensor, qw: torch.Tensor, scale: torch.Tensor, groups: int = 1,
                   round_x: bool = False, rounded: RoundedX | None = None) -> torch.Tensor:
        """x [M, groups*K] @ dequantized FP8 qw [groups*N, K]^T, group by group -> [M, groups*N]; round_x: x rounded
        to e4m3 per 1 x 128 block first, as the released model does (ops/fp8_gemm.py), else taken as given;
        rounded: that rounding of x, made by x's producer (rms_norm_pair_rounded), where the backend can use it."""

    def step_index(self, slot: torch.Tensor, pos: torch.Tensor, start_idx: torch.Tensor, start_pos: torch.Tensor,
                   last_pos: torch.Tensor, trash: int, rings: Mapping[int, Sequence[torch.Tensor]],
                   angles: Sequence[tuple[torch.Tensor, torch.Tensor]], blocks: Mapping[int, Sequence[torch.Tensor]],
                   block_table: torch.Tensor | None) -> None:
        """The step index of T = len(pos) tokens (metadata rows [T] long) into the first T rows of the static
        index buffers: per ring length, per (rotary table, out) pair, per compress ratio (ops/step_index.py)."""


def resolve_kernels(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' | 'torch' | 'triton' -> 'torch' | 'triton' for a shard on `device` holding `dtype`.

    Config validation refuses runtime.kernels=triton where it cannot run before any rank starts; a rank asks
    the same probe of its own device here and, refused, reads the same sentence (capability.kernels_refusal)."""
    if requested == "torch":
        return "torch"
    why = triton_unavailable(device.type)
    if why is None and dtype not in TRITON_DTYPES:
        why = f"a dtype in {[str(d).removeprefix('torch.') for d in TRITON_DTYPES]}, not {dtype}"
    if requested == "auto":
        return "torch" if why else "triton"
    if requested != "triton":
        raise ConfigError(f"'runtime.kernels' must be one of ['auto', 'torch', 'triton'], got {requested!r}")
    if why:
        raise ConfigError(kernels_refusal(why))
    return "triton"


def select_backend(requested: str, device: torch.device, dtype: torch.dtype, pdl: bool = False) -> KernelBackend:
    """The backend for runtime.kernels=`requested` on `device` holding `dtype` (errors: resolve_kernels').
    pdl: programmatic dependent launch, already resolved for this device; the torch backend launches no
    kernel that could use it and ignores it."""
    if resolve_kernels(requested, device, dtype) == "triton":
        return TritonBackend(pdl=pdl)
    return TorchBackend()
