"""The run configuration's schema: one dataclass per section, with defaults, types and allowed choices.

Model keys carry the names of DeepSeek-V4's config.json, so a released config reads directly. A field's
`metadata` holds what the builder checks beyond its type: `choices` (the allowed values) and `internal`
(set by the loader, never read from a file). Besides the sections: the layer selection (`parse_layer_spec`)
and the sizes a config implies (`breakable_sizes`, `compressed_len`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tp_runtime.config_yaml import ConfigError


def _choices(*values: str) -> dict:
    return {"choices": list(values)}


@dataclass
class RopeScaling:
    type: str = field(default="yarn", metadata=_choices("yarn"))
    factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass
class ModelConfig:
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    # One entry per layer (0 window-only, 4 CSA, 128 HCA); entries past num_hidden_layers are MTP layers.
    compress_ratios: list[int] = field(default_factory=list)
    # Which layers this run builds: null (all), "a-b" (inclusive range), "a,b,c" or one index (3).
    layers: str | int | None = None
    # A DeepSeek-V4 checkpoint directory; null draws seeded weights.
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layers, int):  # model.layers=3: layer 3 alone
            self.layers = str(self.layers)

    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    def layer_ids(self) -> list[int]:
        """The selected layer indices, in order."""
        if self.layers is None:
            return list(range(self.num_hidden_layers))
        return parse_layer_spec(self.layers, self.num_hidden_layers)


@dataclass
class ParallelConfig:
    tp: int = 1
    launcher: str = field(default="local", metadata=_choices("local", "ray", "torchrun"))
    backend: str = field(default="auto", metadata=_choices("auto", "gloo", "nccl"))
    # The layer all-reduce (parallel/allreduce.py): nccl (the group's backend, gloo on CPU) | symm_one_shot |
    # symm_two_shot (torch symmetric memory, peer loads and stores on one node's GPUs) | auto (one-shot up to a
    # size measured at start-up, NCCL above and wherever symmetric memory cannot run). Named in every report.
    allreduce: str = field(default="auto", metadata=_choices("auto", "nccl", "symm_one_shot", "symm_two_shot"))
    # Collective timeout: a rank stuck this long in a collective fails the run instead of hanging. Ranks
    # meet at most one step apart (weights load and graphs capture on every rank at once), so a minute is
    # ample, and it bounds how long a rank that lost its peer (hung, not dead) can wait.
    timeout_s: float = 60.0
    # Ray placement-group strategy for the TP bundles: STRICT_PACK keeps a TP group on one node (NVLink);
    # PACK / SPREAD / STRICT_SPREAD let it cross nodes.
    placement_strategy: str = field(default="STRICT_PACK",
                                    metadata=_choices("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"))
    # Seconds to wait for the Ray placement group before failing with what was asked and what exists.
    placement_timeout_s: float = 60.0
    # Testing only (fault injection): rank `fail_rank` stops as step `fail_step` (0-based) begins:
    # fail_mode kill SIGKILLs its own process (a crashed or OOM-killed rank vanishes), stop SIGSTOPs it
    # (a hung rank: alive, its sockets open, answering nothing). null: off.
    fail_rank: int | None = None
    fail_step: int = 0
    fail_mode: str = field(default="kill", metadata=_choices("kill", "stop"))


@dataclass
class RuntimeConfig:
    device: str = field(default="auto", metadata=_choices("auto", "cpu", "cuda"))
    dtype: str = field(default="auto", metadata=_choices("auto", "float32", "bfloat16", "float64"))
    max_seqs: int = 8  # cache slots = sequences in flight
    max_len: int = 1024  # longest sequence (prompt + decode) a slot can hold
    max_tokens_per_step: int = 256  # token budget of one step (decodes + prefill chunks)
    prefill_chunk: int = 64  # longest prefill chunk of one sequence in one step
    seed: int = 0  # seed of the drawn weights
    # bf16: every weight in the run dtype (FP8 checkpoint tensors dequantized on load). fp8: the released
    # FP8 tensors (wq_a, wkv, wq_b, wo_a, wo_b, indexer.wq_b) stay float8_e4m3fn with their 128 x 128
    # block scales and run through the FP8 GEMM (ops/linear.py); CUDA GPUs with FP8 (sm >= 8.9) only.
    weight_format: str = field(default="bf16", metadata=_choices("bf16", "fp8"))
    # With FP8 weights: bf16 keeps the activations as they are (every FP8 GEMM in Triton, outputs differ from
    # dequantize-then-matmul by accumulation order only). e4m3: every FP8 GEMM rounds x to e4m3 per 1 x 128
    # block, as the released inference code does, and multiplies the FP8 operands (ops/fp8_gemm.py: its
    # launches from a tuning table per shape and M, cuBLASLt's block-scaled GEMM among them).
    fp8_activations: str = field(default="bf16", metadata=_choices("bf16", "e4m3"))
    # bf16: caches hold rows in the run dtype. fp8: as released (ops/cache_fp8.py), the window ring and the
    # compressed rows hold 448 e4m3 nope dims with a power-of-two scale per 64, the rope dims in bf16
    # (592 bytes at Flash dims: 583 padded to 16), indexer keys 128 e4m3 values and an fp32 scale (132 bytes, in
    # two tensors); every stored row is rounded so before attention reads it. CUDA only; the compressor state rings
    # stay fp32.
    cache_format: str = field(default="bf16", metadata=_choices("bf16", "fp8"))
    # The lightning indexer's query (ratio-4 layers). bf16: scored as projected, in the run dtype. e4m3: each
    # head's query rounded to e4m3 with one power-of-two scale, as an FP8 indexer key is stored, as DeepSeek's
    # and vLLM's indexers do; with cache_format=fp8 the Triton score kernel then runs FP8 dots on the stored key
    # codes (ops/indexer_topk.py). Any device and kernels; it changes which keys score highest, by the rounding.
    indexer_q: str = field(default="bf16", metadata=_choices("bf16", "e4m3"))
    # Stage-B kernels: torch (the plain path, the semantics, any device) | triton (fused kernels of
    # tp_runtime/ops/, CUDA only) | auto (triton on CUDA when it imports and the dtype is not float64,
    # else torch). The resolved choice is named in every run report and bench record.
    kernels: str = field(default="auto", metadata=_choices("auto", "torch", "triton"))
    # Programmatic dependent launch of the Triton kernels (ops/kernel_support.py): each may start while the
    # kernel before it finishes and waits on the GPU before reading its output; outputs are bitwise equal.
    # on: needs CUDA compute capability >= 9.0 and a Triton with launch_pdl (refused elsewhere) | auto (on
    # where those hold) | off.
    pdl: str = field(default="auto", metadata=_choices("auto", "on", "off"))
    # Streams of stage B on CUDA: 2 runs each compressed layer's indexer and compressor branch on a side
    # stream beside wq_b and the query heads, joined before the attention (README "CUDA graphs"); 1 runs
    # everything on one stream. The CPU always runs one; both give the same values.
    streams: int = field(default=2, metadata={"choices": [1, 2]})


@dataclass
class WorkloadConfig:
    requests: int = 8
    prompt_len: list[int] = field(default_factory=lambda: [16, 200])  # [min, max], drawn per request
    decode_len: list[int] = field(default_factory=lambda: [4, 16])  # [min, max], drawn per request
    # Explicit per-request lengths; when given they replace the drawn ones (length = requests).
    prompt_lens: list[int] | None = None
    decode_lens: list[int] | None = None
    seed: int = 0  # seed of the lengths and of the input hidden states
    inputs: str | None = None  # safetensors file of per-request inputs (README: "Bring your own inputs")
    dump: str | None = None  # safetensors file to write every request's inputs and outputs to


@dataclass
class GraphConfig:
    # eager | breakable (every step a breakable graph) | full (decode-only steps one full graph each, the
    # rest eager) | full_and_breakable (full graphs for decode-only steps, breakable graphs for the rest)
    mode: str = field(default="eager", metadata=_choices("eager", "breakable", "full", "full_and_breakable"))
    break_scope: str = field(default="hoisted", metadata=_choices("wide", "hoisted", "narrow"))
    # Token counts each graph is captured at (a step is padded to the next one), largest first: full graphs
    # (decode-only steps, at most runtime.max_seqs tokens) and breakable graphs.
    capture_sizes: list[int] = field(default_factory=lambda: [64, 32, 16, 8, 4, 2, 1])
    # Breakable graphs only, in addition to capture_sizes: the sizes of mixed and prefill steps (as SGLang's
    # piecewise graphs have their own token counts beside the decode batch sizes). Entries above
    # runtime.max_tokens_per_step are dropped (no step holds that many tokens); steps larger than every
    # breakable size run eagerly. Full graphs never take them: a full graph at prefill size would run the
    # static decode batch at that many rows.
    breakable_capture_sizes: list[int] = field(default_factory=list)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    source: str = field(default="<defaults>", metadata={"internal": True})
    # dotted key (or section) -> where its value was set: the file, an override word, a config.json
    origins: dict[str, str] = field(default_factory=dict, metadata={"internal": True})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        d.pop("origins")
        return d

    def origin(self, key: str) -> str:
        """Where the value of a dotted key came from (its own entry or its section's); else the file."""
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return self.source

    def where(self, *keys: str) -> str:
        """Where the values of `keys` came from, each source once ('FILE and override 'k=v''); else the file.
        Every refusal of a config begins with it."""
        return " and ".join(dict.fromkeys(self.origin(k) for k in keys)) if keys else self.source


def parse_layer_spec(spec: str, n_layers: int) -> list[int]:
    """'0-7' -> [0..7]; '0,3,5' -> [0,3,5]; every index must lie in [0, n_layers)."""
    ids: list[int] = []
    try:
        for part in str(spec).split(","):
            lo, _, hi = part.strip().partition("-")
            ids.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise ConfigError(f"model.layers={spec!r} is not a layer list; use 'a-b' or 'a,b,c'") from None
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad or not ids or len(set(ids)) != len(ids):
        raise ConfigError(
            f"model.layers={spec!r} selects {bad or ids}: layers must be distinct and within 0..{n_layers - 1}"
        )
    return ids


def breakable_sizes(cfg: RunConfig) -> list[int]:
    """The token counts breakable graphs are captured at, largest first: graph.capture_sizes and
    graph.breakable_capture_sizes together, the latter's entries above runtime.max_tokens_per_step dropped
    (no step holds that many tokens, so such a graph would cost capture time and pool memory for nothing)."""
    g, cap = cfg.graph, cfg.runtime.max_tokens_per_step
    return sorted(set(g.capture_sizes) | {s for s in g.breakable_capture_sizes if s <= cap}, reverse=True)


def compressed_len(max_len: int, ratio: int) -> int:
    """Rows of a compressed cache: one per completed block of `ratio` tokens."""
    return math.ceil(max_len / ratio)
