"""Gated pooling compressor: every r tokens of a sequence become one compressed KV row.

Stage A (`project`) is two replicated GEMMs with fp32 output. Stage B (`forward`) adds the
positional bias ape[pos % r] to the scores, pools each block that a token of this step completes,
normalizes, ropes at position i*r and stores row i; then keeps the newest c*r tokens as state.
With r = 4 (c = 2) blocks overlap: entry i softmaxes per channel over block i-1's tokens
(channels [0, D)) and block i's tokens (channels [D, 2D)); block -1 counts as score -inf.
"""

from __future__ import annotations

import torch
from torch import nn

from tp_runtime.batch import StepBatch
from tp_runtime.cache import RingState
from tp_runtime.layers import ReplicatedLinear, RMSNorm
from tp_runtime.ops.torch_path import gather_rows, token_chunks, write_ring
from tp_runtime.rope import RotaryTable, apply_rotary


class Compressor(nn.Module):
    def __init__(self, ratio: int, head_dim: int, hidden: int, eps: float, rope: RotaryTable,
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        assert ratio in (4, 128), f"compress ratio {ratio} not in (4, 128)"
        self.ratio, self.head_dim, self.rope = ratio, head_dim, rope
        self.overlap = ratio == 4
        c = 2 if self.overlap else 1
        self.wkv = ReplicatedLinear(hidden, c * head_dim, dtype, device)
        self.wgate = ReplicatedLinear(hidden, c * head_dim, dtype, device)
        self.ape = nn.Parameter(torch.empty(ratio, c * head_dim, dtype=torch.float32, device=device),
                                requires_grad=False)
        self.norm = RMSNorm(head_dim, eps, dtype, device)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage A: x [T, hidden] -> kv, score [T, c*D] fp32."""
        return self.wkv(x).float(), self.wgate(x).float()

    def forward(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, state: RingState,
                out: torch.Tensor) -> None:
        """Stage B: emit the entries completed in this step into out [slots+1, N, D]; update state.

        Every token of the step is pooled as if it completed a block; the entries of tokens that
        do not (and of padding) land in the trash slot. That keeps this free of host decisions,
        hence capturable, at the price of pooling work for the tokens that complete nothing.
        """
        r, pos = self.ratio, b.pos
        score = score + self.ape[pos.remainder(r)]
        trash = out.shape[0] - 1
        for s, e in token_chunks(len(pos), state.kv.shape[1] * state.kv.shape[2]):
            tok = torch.arange(s, e, device=pos.device)
            block = pos[s:e] // r
            entries = apply_rotary(self.norm(self._pool(kv, score, b, state, tok)), block * r, self.rope)
            slot = torch.where((pos[s:e] + 1).remainder(r) == 0, b.slot[s:e], trash)
            out[slot, block] = entries.to(out.dtype)
        write_ring(state.kv, kv, b)  # after pooling: it read the ring's older rows
        write_ring(state.score, score, b)

    def _pool(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, state: RingState,
              tok: torch.Tensor) -> torch.Tensor:
        """Softmax-weighted sum per channel over the block ending at each token of tok -> [E, D] fp32."""
        span = state.kv.shape[1]  # c*r candidate tokens, oldest first
        qpos = b.pos[tok][:, None] + torch.arange(1 - span, 1, device=kv.device)[None]
        rows, valid = gather_rows(kv, state.kv, b, tok, qpos)  # [E, c*r, c*D]
        gates, _ = gather_rows(score, state.score, b, tok, qpos)
        if self.overlap:  # previous block contributes channels [0, D), current block [D, 2D)
            D, r = self.head_dim, self.ratio
            rows = torch.cat((rows[:, :r, :D], rows[:, r:, D:]), dim=1)
            gates = torch.cat((gates[:, :r, :D], gates[:, r:, D:]), dim=1)
        gates = gates.masked_fill(~valid[..., None], float("-inf"))
        return (gates.softmax(dim=1) * rows).sum(dim=1)
