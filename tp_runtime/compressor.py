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
from tp_runtime.ops.torch_path import gather_rows, write_ring
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
        """Stage B: emit the entries completed in this step into out [slots, N, D]; update state."""
        n, r = b.n_tokens, self.ratio
        pos = b.pos[:n]
        kv, score = kv[:n], score[:n] + self.ape[pos.remainder(r)]
        done = b.lists[("done", r)]  # tokens that complete a block (host-derived: no device sync)
        if done.numel():
            entries = self._pool(kv, score, b, state, done)
            block = pos[done] // r
            entries = apply_rotary(self.norm(entries), block * r, self.rope)
            out[b.slot[done], block] = entries.to(out.dtype)
        write_ring(state.kv, kv, b)
        write_ring(state.score, score, b)

    def _pool(self, kv: torch.Tensor, score: torch.Tensor, b: StepBatch, state: RingState,
              done: torch.Tensor) -> torch.Tensor:
        """Softmax-weighted sum per channel over each completed block's candidates -> [E, D] fp32."""
        span = state.kv.shape[1]  # c*r candidate tokens, oldest first
        qpos = b.pos[done][:, None] + torch.arange(1 - span, 1, device=kv.device)[None]
        rows, valid = gather_rows(kv, state.kv, b, done, qpos)  # [E, c*r, c*D]
        gates, _ = gather_rows(score, state.score, b, done, qpos)
        if self.overlap:  # previous block contributes channels [0, D), current block [D, 2D)
            D, r = self.head_dim, self.ratio
            rows = torch.cat((rows[:, :r, :D], rows[:, r:, D:]), dim=1)
            gates = torch.cat((gates[:, :r, :D], gates[:, r:, D:]), dim=1)
        gates = gates.masked_fill(~valid[..., None], float("-inf"))
        return (gates.softmax(dim=1) * rows).sum(dim=1)
