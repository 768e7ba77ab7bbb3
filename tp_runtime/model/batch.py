"""StepBatch: the per-step metadata the layers read (views of static device buffers), and LiveBatch.

The batch is what the layers read; the engine's StepBuffers fill it from a StepPlan. Buffers are
allocated once at the largest step size and never reallocated (a CUDA graph captured on them
replays on later steps' contents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tp_runtime.ops.index import StepIndex


@dataclass
class StepBatch:
    """Views [n_padded] of the static buffers; tokens past n_tokens are padding.

    Padding tokens carry the trash slot (one spare row at the end of every cache), so device code
    may process all n_padded tokens without a host-side mask: padding reads and writes only trash.
    Captured code reads only the tensors; the host ints are for eager code.
    """

    x: torch.Tensor  # [T, hidden] input hidden states
    slot: torch.Tensor  # [T] cache slot of each token's sequence (trash slot for padding)
    pos: torch.Tensor  # [T] absolute position
    start_idx: torch.Tensor  # [T] flat index of the first token of this token's chunk
    start_pos: torch.Tensor  # [T] position of that first token
    last_pos: torch.Tensor  # [T] position of the chunk's last token
    # Host ints that size stage B's candidate sets (eager code and breaks). A full graph's static batch
    # sets them from the config (n_tokens = len(pos), max_pos = runtime.max_len - 1), so nothing captured
    # depends on a step's values.
    n_tokens: int  # real tokens; the step runs with len(pos) (a capture size, or n_tokens)
    max_pos: int  # largest position in the step; bounds compressed candidate sets
    ix: StepIndex  # rows, positions and rotary angles derived from the metadata (step_index.py)
    # Every sequence has one token in this step (the static decode path): the row a token stores into the
    # window ring (position pos - W's) is one no token of the step reads, so the store may come before the
    # attention, in the heads launch. False: stored after the attention (a chunk's tokens read each other's).
    decode: bool = False


class LiveBatch:
    """Holder of the step being run. Eager breaks read `live.batch` when they run, so a replayed
    graph's eager calls see the current step's metadata rather than the one seen at capture."""

    def __init__(self) -> None:
        self.batch: StepBatch | None = None
