"""Benchmark sweep configs: a base run config + a grid of values per dotted key + bench settings.

    name: scaling
    base: v4_flash.yaml            # a run config file (relative to this file) or an inline mapping
    overrides: [parallel.launcher=local]   # words as on the command line, applied first
    grid:                          # every combination is one point
      parallel.tp: [1, 2, 4]
      bench.batch: [1, 8, 32, 128]
      bench.context: [4096, 32768]
      modes: [eager, breakable-wide, breakable-hoisted]
      model.num_hidden_layers: [8]
    bench: {warmup_steps: 3, timed_steps: 10, repeats: 5, output: out/bench}

`grid.shard_of_tp: [1, 2, 4, 8]` turns the sweep into projected points (bench/projection.py): per value k,
rank `bench.shard_rank`'s shard of tp k is built in this one process on one GPU and run with the layer
all-reduce left out; parallel.tp stays 1. It needs a CUDA device and is refused elsewhere.

Command-line words `bench.*`, `grid.<key>` and `name` change the sweep; any other dotted key
(`parallel.launcher=ray`, `runtime.device=cuda`, `model.num_hidden_layers=4`) changes the base.
Errors name the key and where it came from, as config.py's do. The bench sets the Worker-sizing keys
(runtime.max_seqs, max_len, max_tokens_per_step, prefill_chunk, graph.*) itself from the grid; a command-line
word setting one of them is refused (BENCH_SET_KEYS).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tp_runtime.config import ConfigError, ModelConfig, RunConfig, config_from_dict, from_mapping, set_dotted
from tp_runtime.config_yaml import read_mapping
from tp_runtime.sweep_file import read_sweep_file, resolve_beside

# Grid value of `modes` -> (graph.mode, graph.break_scope). Eager ignores the scope (both are plain calls).
MODES = {"eager": ("eager", "hoisted"), "breakable-wide": ("breakable", "wide"),
         "breakable-hoisted": ("breakable", "hoisted"), "breakable-narrow": ("breakable", "narrow"),
         "full": ("full", "narrow"), "full_and_breakable": ("full_and_breakable", "narrow")}
# A mode may name settings after '@', joined by '+' ("full@fp8", "full@triton", "full@fp8+triton+nccl",
# "full@kv_fp8"): a weight format (runtime.weight_format: bf16, fp8), stage-B kernels (runtime.kernels: torch,
# triton), FP8 GEMMs rounding their activations (runtime.fp8_activations=e4m3: a8), a cache format
# (runtime.cache_format: kv_bf16, kv_fp8), the indexer's query (runtime.indexer_q: iq_bf16, iq_e4m3) and / or
# the layer all-reduce (parallel.allreduce: nccl, symm_one_shot, symm_two_shot), programmatic dependent launch
# (runtime.pdl: pdl_on, pdl_off) and the streams of stage B (runtime.streams: streams1, streams2). Its lanes
# run on a shard of their own (at tp > 1 for the all-reduce), interleaved with the other modes' lanes (bf16 vs
# fp8, torch vs triton, bf16 vs fp8 caches, auto vs nccl all-reduce in one point).
LANE_SETTINGS = {"bf16": ("weight_format", "bf16"), "fp8": ("weight_format", "fp8"),
                 "torch": ("kernels", "torch"), "triton": ("kernels", "triton"),
                 "a8": ("fp8_activations", "e4m3"),
                 "kv_bf16": ("cache_format", "bf16"), "kv_fp8": ("cache_format", "fp8"),
                 "iq_bf16": ("indexer_q", "bf16"), "iq_e4m3": ("indexer_q", "e4m3"),
                 "nccl": ("allreduce", "nccl"), "symm_one_shot": ("allreduce", "symm_one_shot"),
                 "symm_two_shot": ("allreduce", "symm_two_shot"),
                 "pdl_on": ("pdl", "on"), "pdl_off": ("pdl", "off"),
                 "streams1": ("streams", 1), "streams2": ("streams", 2)}
LANE_SECTIONS = {"allreduce": "parallel"}  # the section of a lane setting's key (default: runtime)


def split_mode(mode: str) -> tuple[str, dict[str, str] | None]:
    """'full@fp8+triton' -> ('full', {'weight_format': 'fp8', 'kernels': 'triton'}); 'full@kv_fp8' ->
    ('full', {'cache_format': 'fp8'}); 'full' -> ('full', {}); an unknown setting -> (base, None)."""
    base, _, rest = mode.partition("@")
    words = [w for w in rest.split("+") if w] if rest else []
    if any(w not in LANE_SETTINGS for w in words):
        return base, None
    return base, dict(LANE_SETTINGS[w] for w in words)


# Run-config keys the bench sets itself for every Worker (`worker_config`): a command-line word naming one is
# refused, since its value would be replaced (the grid's bench.batch, bench.context and modes set them).
BENCH_SET_KEYS = ("runtime.max_seqs", "runtime.max_len", "runtime.max_tokens_per_step", "runtime.prefill_chunk",
                  "graph.")
MAX_COPY_MIB = 16384  # bench.copy_mib: two buffers of this size (copy source and target), 32 GiB in all


BENCH_AXES = ("parallel.tp", "bench.batch", "bench.context", "modes", "model_file", "shard_of_tp")
# plus every model.<field>
RUN_AXES = ("runtime.dtype", "runtime.weight_format", "runtime.fp8_activations", "runtime.cache_format")


@dataclass
class BenchSettings:
    warmup_steps: int = 3  # decode steps per point and variant before timing (excluded)
    timed_steps: int = 10  # decode steps per repeat
    repeats: int = 5  # interleaved repeats: A B A B ... with timed_steps each
    break_steps: int = 2  # extra steps timed with per-break events (kept out of the step times)
    profile_steps: int = 2  # extra steps under the torch profiler: kernels per step, GPU busy ms (0: off)
    profile: bool = False  # also per point and lane: a Chrome trace of profile_steps eager steps of its path
    #                        and GPU ms by group (weight GEMMs, attention, indexer, ...) in profile_view.txt;
    #                        kernels per layer kind (main and side stream) in the records
    prefill_chunk: int | list[int] = 256  # tokens of the timed prefill chunk (one sequence); a list: each size
    prefill_steps: int = 2  # timed prefill chunks per point and chunk size, after one untimed chunk
    peak_tflops: float = 790.0  # prefill_peak_share's peak: dense bf16 TFLOP/s cuBLAS attains on an H200
    allreduce_iters: int = 50  # all-reduces per timing of the [batch, hidden] message
    copy_mib: int = 256  # buffer of the bandwidth measurement (copy and read-only stream); >= 1024 on a GPU
    compare_tp1: bool = True  # tp > 1: rank 0 also holds tp = 1 Workers, interleaved, for speedups
    prefill_check: bool = True  # per configuration: the first point again, interleaved with a real-prefill cache
    plots: bool = True
    output: str = "out/bench"  # results go to <output>/<name>/
    seed: int = 0  # seed of decode inputs and of seeded cache rows
    shard_rank: int = 0  # grid.shard_of_tp: the rank whose shard is built (a rank of every shard_of_tp value)
    projected_allreduce_us: float = 5.0  # grid.shard_of_tp: the all-reduce latency per layer a projection assumes

    @property
    def prefill_chunks(self) -> list[int]:
        """The timed prefill chunk sizes, in order (bench.prefill_chunk as a list)."""
        return list(self.prefill_chunk) if isinstance(self.prefill_chunk, list) else [self.prefill_chunk]


@dataclass
class SweepConfig:
    name: str
    base: dict  # raw run-config mapping, base overrides applied, validated once
    grid: dict[str, list]
    bench: BenchSettings = field(default_factory=BenchSettings)
    source: str = "<sweep>"
    base_file: str | None = None  # the base run config's file (None: inline)

    @property
    def modes(self) -> list[str]:
        return self.grid.get("modes", ["eager"])

    @property
    def tps(self) -> list[int]:
        return self.grid.get("parallel.tp", [config_from_dict(self.base).parallel.tp])

    @property
    def shard_tps(self) -> list[int] | None:
        """grid.shard_of_tp: the tp values whose rank shard is projected in one process (None: measured tp)."""
        return self.grid.get("shard_of_tp")

    def variants(self) -> list[tuple[tuple[str, Any], ...]]:
        """Combinations of the run-config axes (model_file, model.*, runtime.dtype): one Worker set each."""
        # model_file first: it replaces the model section, then model.* keys change it.
        keys = sorted((k for k in self.grid if k not in BENCH_AXES or k == "model_file"),
                      key=lambda k: k != "model_file")
        return [tuple(zip(keys, combo)) for combo in itertools.product(*(self.grid[k] for k in keys))]

    def n_points(self) -> int:
        """Timed (variant, shard, context, batch) units per tp, all modes included."""
        return (len(self.variants()) * len(self.shard_tps or [1]) * len(self.grid["bench.batch"])
                * len(self.grid["bench.context"]))

    def headroom(self) -> int:
        """Positions a point adds past its context: warm-up, repeats, break steps and prefill chunks of
        every mode (the modes' lanes continue the same sequences)."""
        b = self.bench
        per_mode = (b.warmup_steps + b.repeats * b.timed_steps + b.break_steps + b.profile_steps * (1 + b.profile)
                    + (1 + b.prefill_steps) * sum(b.prefill_chunks))
        return len(self.modes) * per_mode

    def worker_config(self, tp: int, variant: tuple[tuple[str, Any], ...], mode: str) -> RunConfig:
        """The RunConfig of the Worker that serves every batch and context of (tp, variant, mode)."""
        data = copy.deepcopy(self.base)
        for key, value in variant:
            if key == "model_file":
                data["model"] = _model_section(value, self.source)
            else:
                set_dotted(data, key, value, self.source)
        batches, contexts = self.grid["bench.batch"], self.grid["bench.context"]
        base_mode, settings = split_mode(mode)
        graph_mode, scope = MODES[base_mode]
        data.setdefault("parallel", {})["tp"] = tp
        fail_rank = data["parallel"].get("fail_rank")
        if fail_rank is not None and fail_rank >= tp:  # fault injection: only where that rank exists
            data["parallel"]["fail_rank"] = None
        for key, word in settings.items():
            data.setdefault(LANE_SECTIONS.get(key, "runtime"), {})[key] = word
        # The prefill check runs its smallest batch on a second set of slots beside the seeded ones.
        slots = max(batches + ([2 * min(batches)] if self.bench.prefill_check else []))
        data.setdefault("runtime", {}).update(
            max_seqs=slots, max_len=max(contexts) + self.headroom(), prefill_chunk=max(self.bench.prefill_chunks),
            max_tokens_per_step=max(batches + self.bench.prefill_chunks))
        # The bench times decode steps at its batches: graphs at those sizes only (a base's breakable prefill sizes
        # would add captures, pool memory and graph-replayed prefill chunks to every breakable lane).
        data["graph"] = {**data.get("graph", {}), "mode": graph_mode, "break_scope": scope,
                         "capture_sizes": sorted(set(batches), reverse=True), "breakable_capture_sizes": []}
        where = ", ".join(f"{k}={v!r}" for k, v in variant) or "base"
        return config_from_dict(data, f"{self.source} (tp={tp}, {where}, mode={mode})")


# ---------------------------------------------------------------- loading


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepConfig:
    """Read a sweep YAML, apply command-line words, validate every Worker config it implies."""
    path = Path(path)
    _refuse_bench_set_keys(overrides or [])
    f = read_sweep_file(path, "sweep config", "bench", overrides)
    source = str(path)
    sweep = SweepConfig(f.name, f.base, f.grid, from_mapping(BenchSettings, f.own, "bench", source), source,
                        f.base_file)
    _validate(sweep, path)
    return sweep


def _refuse_bench_set_keys(words: list[str]) -> None:
    """A command-line word setting a key the bench sets itself (BENCH_SET_KEYS) would be dropped: refused."""
    for word in words:
        key = word.partition("=")[0].strip()
        if any(key == k or (k.endswith(".") and key.startswith(k)) for k in BENCH_SET_KEYS):
            raise ConfigError(f"override {word!r}: the bench sets '{key}' itself for every point (runtime.max_len from "
                              "grid bench.context, max_seqs and capture sizes from grid bench.batch, graph modes from "
                              "grid modes, prefill_chunk from bench.prefill_chunk): set those instead")


def _model_section(name: str, sweep_path: str) -> dict:
    data = read_mapping(resolve_beside(name, sweep_path), "model file", "a 'model:' section")
    if not isinstance(data.get("model"), dict):
        raise ConfigError(f"{sweep_path}: grid 'model_file' value {name!r} has no 'model:' section")
    return data["model"]


# ---------------------------------------------------------------- validation


def _allowed_axes() -> list[str]:
    return list(BENCH_AXES) + list(RUN_AXES) + [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)]


def _validate(sweep: SweepConfig, path: Path) -> None:
    src = str(path)
    config_from_dict(sweep.base, f"{src} base")
    allowed = _allowed_axes()
    for key, values in sweep.grid.items():
        if key not in allowed:
            raise ConfigError(f"{src}: unknown grid key '{key}'; allowed grid keys: {allowed[:6]} "
                              "and model.<key> (the bench sets runtime.max_*, prefill_chunk and graph.* itself)")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{src}: grid '{key}' must be a non-empty list, got {values!r}")
    for key in ("bench.batch", "bench.context"):
        if key not in sweep.grid:
            raise ConfigError(f"{src}: grid needs '{key}' (a list of positive integers)")
        bad = [v for v in sweep.grid[key] if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            raise ConfigError(f"{src}: grid '{key}' holds {bad}; values must be positive integers")
    bad = [m for m in sweep.modes if split_mode(m)[0] not in MODES or split_mode(m)[1] is None]
    if bad:
        raise ConfigError(f"{src}: grid 'modes' holds {bad}; allowed modes: {list(MODES)}, each optionally with "
                          f"@ and settings joined by + ({', '.join(LANE_SETTINGS)})")
    b = sweep.bench
    for name in ("timed_steps", "repeats", "allreduce_iters", "copy_mib"):
        if getattr(b, name) < 1:
            raise ConfigError(f"{src}: 'bench.{name}' must be >= 1, got {getattr(b, name)}")
    if b.copy_mib > MAX_COPY_MIB:
        raise ConfigError(f"{src}: 'bench.copy_mib'={b.copy_mib} is above the limit of {MAX_COPY_MIB} MiB (the "
                          "bandwidth measurement holds two buffers of that size; 1024 already saturates a GPU)")
    if not b.prefill_chunks or min(b.prefill_chunks) < 1:
        raise ConfigError(f"{src}: 'bench.prefill_chunk' must be a token count >= 1 or a non-empty list of them, "
                          f"got {b.prefill_chunk}")
    if not math.isfinite(b.peak_tflops) or b.peak_tflops <= 0:
        raise ConfigError(f"{src}: 'bench.peak_tflops' must be a finite TFLOP/s > 0, got {b.peak_tflops}")
    for name in ("warmup_steps", "break_steps", "profile_steps", "prefill_steps"):
        if getattr(b, name) < 0:
            raise ConfigError(f"{src}: 'bench.{name}' must be >= 0, got {getattr(b, name)}")
    for tp in sweep.tps:  # every Worker config must be valid before any rank starts
        for variant in sweep.variants():
            for mode in sweep.modes:
                sweep.worker_config(tp, variant, mode)
    if sweep.shard_tps is not None:
        _validate_shards(sweep, src)


def _validate_shards(sweep: SweepConfig, src: str) -> None:
    """grid.shard_of_tp: positive tp values that split every variant's heads and output groups, a shard rank
    of each, one process (parallel.tp 1), no all-reduce lanes, FP8 shards on whole blocks, a CUDA device."""
    import torch  # here, not with the module: a sweep refused before this is refused without torch's import

    from tp_runtime.weights.specs import check_fp8_shards

    values, b = sweep.shard_tps, sweep.bench
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad or len(set(values)) != len(values):
        raise ConfigError(f"{src}: grid 'shard_of_tp' holds {bad or values}; values must be distinct positive integers")
    for variant in sweep.variants():
        cfg = sweep.worker_config(1, variant, sweep.modes[0])
        m = cfg.model
        bad = [k for k in values if m.num_attention_heads % k or m.o_groups % k]
        if bad:
            raise ConfigError(f"{src}: grid 'shard_of_tp' holds {bad}: each value must divide num_attention_heads="
                              f"{m.num_attention_heads} and o_groups={m.o_groups} ({cfg.source})")
        fp8 = any(sweep.worker_config(1, variant, mode).runtime.weight_format == "fp8" for mode in sweep.modes)
        for k in values if fp8 else ():
            try:
                check_fp8_shards(m, k)
            except ValueError as e:
                raise ConfigError(f"{src}: grid 'shard_of_tp'={k} with FP8 weights: {e}") from None
    if isinstance(b.shard_rank, bool) or not 0 <= b.shard_rank < min(values):
        raise ConfigError(f"{src}: 'bench.shard_rank'={b.shard_rank} must be a rank of every grid 'shard_of_tp' "
                          f"value: 0..{min(values) - 1}")
    if not math.isfinite(b.projected_allreduce_us) or b.projected_allreduce_us < 0:
        raise ConfigError(f"{src}: 'bench.projected_allreduce_us' must be a finite latency >= 0, "
                          f"got {b.projected_allreduce_us}")
    if sweep.tps != [1]:
        raise ConfigError(f"{src}: grid 'shard_of_tp' builds each shard in one process: parallel.tp must be 1, "
                          f"got {sweep.tps}")
    with_ar = [m for m in sweep.modes if "allreduce" in (split_mode(m)[1] or {})]
    if with_ar:
        raise ConfigError(f"{src}: grid 'modes' holds {with_ar}: an all-reduce setting has nothing to run with "
                          "grid 'shard_of_tp' (the all-reduce is left out)")
    device = config_from_dict(sweep.base).runtime.device
    if device == "cpu" or not torch.cuda.is_available():
        why = "runtime.device=cpu" if device == "cpu" else "CUDA is not available on this machine"
        raise ConfigError(f"{src}: grid 'shard_of_tp' projects GPU ranks and needs a CUDA device; {why}")
