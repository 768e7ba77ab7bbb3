"""Run configuration: YAML file + dotted `key=value` overrides -> typed, validated dataclasses.

Model keys carry the names of DeepSeek-V4's config.json, so a released config reads directly.
Every error names the offending key, where it came from (file or command line) and what is allowed:

    cfg = load_config("configs/tiny.yaml", ["parallel.tp=4", "workload.requests=16"])

With model.checkpoint set, the model keys come from the checkpoint's config.json; the YAML and the
overrides still choose layers, parallel, runtime, workload and graph settings, and a model value of
theirs that disagrees with config.json is refused (merge_checkpoint_config).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ConfigError is defined beside the YAML reader (which raises it too); every module imports it from here.
from tp_runtime.config_yaml import ConfigError, parse_value, read_mapping


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
    placement_strategy: str = field(default="STRICT_PACK", metadata=_choices("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"))
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
    # dequantize-then-matmul by accumulation order only). e4m3: GEMMs of more than 32 rows (prefill chunks,
    # large batches) round x to e4m3 per 1 x 128 block, as the released inference code does, and run
    # cuBLASLt's block-scaled FP8 GEMM (SM90): 1.2-3x faster there, about 2.7 % per GEMM output.
    fp8_activations: str = field(default="bf16", metadata=_choices("bf16", "e4m3"))
    # bf16: caches hold rows in the run dtype. fp8: as released (ops/cache_fp8.py), the window ring and the
    # compressed rows hold 448 e4m3 nope dims with a power-of-two scale per 64, the rope dims in bf16
    # (584 bytes at Flash dims), indexer keys 128 e4m3 values and an fp32 scale (132 bytes); every stored
    # row is rounded so before attention reads it. CUDA only; the compressor state rings stay fp32.
    cache_format: str = field(default="bf16", metadata=_choices("bf16", "fp8"))
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


# ---------------------------------------------------------------- parsing


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


def parse_override(word: str) -> tuple[str, Any]:
    """'parallel.tp=4' -> ('parallel.tp', 4); the value is read as strict YAML 1.2 (config_yaml.py)."""
    key, sep, raw = word.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {word!r} is not of the form section.key=value")
    return key.strip(), parse_value(raw, f"override {word!r}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key, source)
        for a in inner:  # the first type that accepts the value
            try:
                return _coerce(value, a, key, source)
            except ConfigError:
                pass
        raise ConfigError(f"{source}: '{key}' must be {' or '.join(map(_type_name, inner))}, "
                          f"got {type(value).__name__} {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{key}' must be a list of {_type_name(item)}, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, source)
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[tp]
    if not ok:
        raise ConfigError(f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return float(value) if tp is float else value


def _build(cls: type, data: Any, prefix: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix or '<top>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields), key=str)  # keys of any type (a dict built in code)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"{source}: unknown key '{where}{unknown[0]}'; allowed keys under '{prefix or '<top>'}': {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        choices = fields[name].metadata.get("choices")
        kwargs[name] = _coerce(value, hints[name], key, source)  # YAML 1.2: a bare on / off is a string
        if choices and kwargs[name] not in choices:
            raise ConfigError(f"{source}: '{key}' must be one of {choices}, got {kwargs[name]!r}")
    return cls(**kwargs)


def _set_dotted(data: dict, key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{key}' descends into '{p}', which is not a section")
        node = child
    node[parts[-1]] = value


def read_yaml(path: str | Path) -> dict:
    """The mapping a YAML config file holds; anything but a regular file holding a mapping is refused."""
    sections = [f.name for f in dataclasses.fields(RunConfig) if not f.metadata.get("internal")]
    return read_mapping(path, "config file", f"sections {sections}")


def _origins(data: dict, source: str, prefix: str = "") -> dict[str, str]:
    """Every dotted key (and section) a mapping sets -> source."""
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        out[key] = source
        if isinstance(v, dict):
            out.update(_origins(v, source, key + "."))
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or defaults when path is None), apply overrides, validate."""
    data: dict = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        data = read_yaml(path)
    origins = _origins(data, source)  # dotted key -> where it was set
    for word in overrides or []:
        key, value = parse_override(word)
        _set_dotted(data, key, value, f"override {word!r}")
        # Build once per override so an error names the command-line word rather than the file.
        _build(RunConfig, data, "", f"{source} with override {word!r}")
        origins = {k: v for k, v in origins.items() if not k.startswith(key + ".")}
        origins.update(_origins({key: value}, f"override {word!r}"))
    cfg = _build(RunConfig, data, "", source)
    if cfg.model.checkpoint:  # the checkpoint's config.json supplies the model keys
        model_origins = {k.split(".")[1]: v for k, v in origins.items() if k.startswith("model.")}
        path_json = merge_checkpoint_config(data["model"], model_origins)
        origins.update({f"model.{k}": str(path_json) for k in data["model"]
                        if k not in RUN_MODEL_KEYS and model_origins.get(k) is None})
        cfg = _build(RunConfig, data, "", source)
    cfg.source, cfg.origins = source, origins
    validate(cfg)
    return cfg


def config_from_dict(data: dict, source: str = "<dict>") -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (how workers receive it)."""
    cfg = _build(RunConfig, data, "", source)
    cfg.source = source
    validate(cfg)
    return cfg


# ---------------------------------------------------------------- a checkpoint's config.json

CHECKPOINT_CONFIG = "config.json"
# ModelConfig keys that choose what to run, not what the model is: never taken from config.json.
RUN_MODEL_KEYS = ("layers", "checkpoint")
# Keys a checkpoint's config.json must give: they fix the tensor shapes.
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
              "q_lora_rank", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "compress_ratios")


def read_checkpoint_config(directory: str | Path) -> tuple[dict, Path]:
    """The ModelConfig keys of a checkpoint's config.json (raw JSON values) and that file's path.

    The file's other keys (vocabulary, MoE, quantization) lie outside this project and are ignored.
    """
    path = Path(directory) / CHECKPOINT_CONFIG
    if not Path(directory).is_dir():
        raise ConfigError(f"model.checkpoint={str(directory)!r} is not a directory (a DeepSeek-V4 checkpoint "
                          "directory holds config.json, model.safetensors.index.json and model-*.safetensors)")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model.checkpoint: {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    missing = [k for k in SHAPE_KEYS if k not in raw] if isinstance(raw, dict) else list(SHAPE_KEYS)
    if missing:
        raise ConfigError(f"{path} lacks the model keys {missing}; a DeepSeek-V4 config.json gives every shape")
    keys = {f.name for f in dataclasses.fields(ModelConfig)} - set(RUN_MODEL_KEYS)
    values = {k: raw[k] for k in keys if k in raw}
    if isinstance(values.get("rope_scaling"), dict):  # keep the YaRN keys this project reads
        known = {f.name for f in dataclasses.fields(RopeScaling)}
        values["rope_scaling"] = {k: v for k, v in values["rope_scaling"].items() if k in known}
    _build(ModelConfig, values, "model", str(path))  # types checked here, so errors name config.json
    return values, path


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 16 == 16.0, lists elementwise, nested mappings key by key."""
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _agree(key: str, mine: Any, theirs: Any, origin: str, path: Path) -> None:
    if isinstance(mine, dict) and isinstance(theirs, dict):  # rope_scaling: the sub-keys both give
        for k in sorted(mine.keys() & theirs.keys()):
            _agree(f"{key}.{k}", mine[k], theirs[k], origin, path)
        return
    if not _same(mine, theirs):
        hint = " (select layers with model.layers=a-b instead)" if key == "num_hidden_layers" else ""
        raise ConfigError(f"model.{key}: {origin} sets {mine!r}, but the checkpoint's {path} has {theirs!r}; "
                          f"model shapes come from the checkpoint: drop model.{key} from the run config or "
                          f"make it agree{hint}")


def merge_checkpoint_config(model: dict, origins: dict[str, str]) -> Path:
    """Fill a raw model section from the checkpoint's config.json, in place (load_config calls this);
    returns that config.json's path.

    config.json decides every model key it gives; a YAML or override value that disagrees is an error
    naming the key, both values and both files (`origins`: key -> where the run's value came from).
    The run keys (layers, checkpoint) stay the run's; the layer selection must lie inside the checkpoint.
    """
    directory = Path(str(model["checkpoint"])).expanduser().resolve()
    values, path = read_checkpoint_config(directory)
    model["checkpoint"] = str(directory)  # absolute: ranks may start in another working directory
    for key, theirs in values.items():
        if key in model:
            _agree(key, model[key], theirs, origins.get(key, "the run config"), path)
            if isinstance(model[key], dict) and isinstance(theirs, dict):
                theirs = {**model[key], **theirs}
        model[key] = theirs
    if model.get("layers") is not None:
        try:
            parse_layer_spec(model["layers"], values["num_hidden_layers"])
        except ConfigError as e:
            raise ConfigError(f"{origins.get('layers', 'the run config')}: {e} ({path} has "
                              f"num_hidden_layers={values['num_hidden_layers']})") from None
    return path


def checkpoint_disagreements(model: ModelConfig, directory: str | Path) -> tuple[list[str], Path]:
    """Where a built ModelConfig differs from the checkpoint's config.json, as 'key: run X, checkpoint Y'."""
    values, path = read_checkpoint_config(directory)
    ckpt = _build(ModelConfig, values, "model", str(path))
    diffs = [f"model.{k}: the run has {getattr(model, k)!r}, the checkpoint {getattr(ckpt, k)!r}"
             for k in sorted(values) if getattr(model, k) != getattr(ckpt, k)]
    return diffs, path


# ---------------------------------------------------------------- validation


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _require(cond: bool, cfg: RunConfig, msg: str, *keys: str) -> None:
    """Refuse with msg, naming where the values of `keys` came from (the file, an override word)."""
    if not cond:
        where = " and ".join(dict.fromkeys(cfg.origin(k) for k in keys)) if keys else cfg.source
        raise ConfigError(f"{where}: {msg}")


# Longest accepted timeout: longer ones overflow the timedelta / millisecond counts the process groups,
# the rendezvous store and the heartbeat are given (1e300 is finite), and a week already means "never".
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _number_in(cfg: RunConfig, key: str, value: float, lo: float, hi: float = math.inf, lo_open: bool = True,
               why: str = "") -> None:
    """Refuse a value that is not finite or lies outside (lo, hi] ([lo, hi] when not lo_open)."""
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
    _require(ok, cfg, f"'{key}' must be a finite number {bound}{why}, got {value!r}", key)


def _check_ranges(cfg: RunConfig) -> None:
    """Value ranges the math and the launchers need: rope / YaRN settings, eps, timeouts."""
    m, s, p = cfg.model, cfg.model.rope_scaling, cfg.parallel
    for name in ("rope_theta", "compress_rope_theta"):  # log(base) divides: base 1 has no frequencies
        _number_in(cfg, f"model.{name}", getattr(m, name), 1.0, why=" (a rotary base)")
    _number_in(cfg, "model.rms_norm_eps", m.rms_norm_eps, 0.0)
    _number_in(cfg, "model.rope_scaling.factor", s.factor, 0.0)
    _number_in(cfg, "model.rope_scaling.original_max_position_embeddings", s.original_max_position_embeddings, 0)
    _number_in(cfg, "model.rope_scaling.beta_slow", s.beta_slow, 0.0)
    _number_in(cfg, "model.rope_scaling.beta_fast", s.beta_fast, 0.0)
    _require(s.beta_fast > s.beta_slow, cfg, f"'model.rope_scaling.beta_fast'={s.beta_fast:g} must be greater than "
             f"beta_slow={s.beta_slow:g} (YaRN blends between the two)",
             "model.rope_scaling.beta_fast", "model.rope_scaling.beta_slow")
    for name in ("timeout_s", "placement_timeout_s"):
        _number_in(cfg, f"parallel.{name}", getattr(p, name), 0.0, MAX_TIMEOUT_S, why=" seconds")


def validate(cfg: RunConfig) -> None:
    """Cross-field checks: shapes the math needs, tp divisibility, value ranges, workload and runtime bounds."""
    m, p, r, w, g = cfg.model, cfg.parallel, cfg.runtime, cfg.workload, cfg.graph
    _check_ranges(cfg)
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
                 "o_groups", "o_lora_rank", "sliding_window", "index_n_heads", "index_head_dim", "index_topk"):
        _require(getattr(m, name) > 0, cfg, f"'model.{name}' must be positive, got {getattr(m, name)}", f"model.{name}")
    _require(0 < m.qk_rope_head_dim <= min(m.head_dim, m.index_head_dim) and m.qk_rope_head_dim % 2 == 0, cfg,
             f"'model.qk_rope_head_dim'={m.qk_rope_head_dim} must be even and at most head_dim and index_head_dim",
             "model.qk_rope_head_dim", "model.head_dim", "model.index_head_dim")
    _require(m.num_attention_heads % m.o_groups == 0, cfg,
             f"'model.o_groups'={m.o_groups} must divide num_attention_heads={m.num_attention_heads}",
             "model.o_groups", "model.num_attention_heads")
    _require(len(m.compress_ratios) >= m.num_hidden_layers, cfg,
             f"'model.compress_ratios' has {len(m.compress_ratios)} entries; needs one per layer "
             f"(num_hidden_layers={m.num_hidden_layers})", "model.compress_ratios", "model.num_hidden_layers")
    bad = sorted({x for x in m.compress_ratios if x not in (0, 4, 128)})
    _require(not bad, cfg, f"'model.compress_ratios' holds {bad}; allowed ratios: [0, 4, 128]", "model.compress_ratios")
    try:
        m.layer_ids()
    except ConfigError as e:
        raise ConfigError(f"{cfg.origin('model.layers')}: {e}") from None
    allowed_tp = [d for d in _divisors(m.num_attention_heads) if m.o_groups % d == 0]
    _require(p.tp in allowed_tp, cfg,
             f"'parallel.tp'={p.tp} must divide num_attention_heads={m.num_attention_heads} and "
             f"o_groups={m.o_groups}; allowed values: {allowed_tp}",
             "parallel.tp", "model.num_attention_heads", "model.o_groups")
    _require(p.fail_rank is None or 0 <= p.fail_rank < p.tp, cfg,
             f"'parallel.fail_rank'={p.fail_rank} must be a rank in 0..{p.tp - 1} (parallel.tp={p.tp}) or null",
             "parallel.fail_rank", "parallel.tp")
    _require(not p.allreduce.startswith("symm") or (r.device != "cpu" and p.backend != "gloo"), cfg,
             f"'parallel.allreduce'={p.allreduce} needs CUDA GPUs with NCCL (symmetric memory); runtime.device="
             f"{r.device}, parallel.backend={p.backend}: use parallel.allreduce=auto or nccl",
             "parallel.allreduce", "runtime.device", "parallel.backend")
    _require(p.fail_step >= 0, cfg, f"'parallel.fail_step' must be >= 0, got {p.fail_step}", "parallel.fail_step")
    for name in ("max_seqs", "max_len", "max_tokens_per_step", "prefill_chunk"):
        _require(getattr(r, name) > 0, cfg, f"'runtime.{name}' must be positive, got {getattr(r, name)}",
                 f"runtime.{name}")
    _require(r.kernels != "triton" or r.dtype != "float64", cfg,
             "'runtime.kernels'=triton runs bfloat16 and float32; runtime.dtype=float64 needs runtime.kernels=torch "
             "(or auto)", "runtime.kernels", "runtime.dtype")
    if r.kernels == "triton":
        missing = triton_unavailable(r.device)
        _require(missing is None, cfg, f"'runtime.kernels'=triton needs {missing}; use runtime.kernels=torch or auto",
                 "runtime.kernels")
    if r.pdl == "on":
        from tp_runtime.ops.kernel_support import pdl_unavailable

        torch_kernels = r.kernels == "torch"
        missing = "runtime.kernels=triton or auto (PDL launches Triton kernels)" if torch_kernels \
            else pdl_unavailable(r.device)
        _require(missing is None, cfg, f"'runtime.pdl'=on needs {missing}; use runtime.pdl=auto or off",
                 "runtime.pdl", *(("runtime.kernels",) if torch_kernels else ()))
    _require(r.max_tokens_per_step >= r.max_seqs, cfg,
             f"'runtime.max_tokens_per_step'={r.max_tokens_per_step} must be at least runtime.max_seqs={r.max_seqs} "
             "so every running sequence can decode each step", "runtime.max_tokens_per_step", "runtime.max_seqs")
    _require(w.requests >= 0, cfg, f"'workload.requests' must be >= 0, got {w.requests}", "workload.requests")
    for name in ("prompt_len", "decode_len"):
        v = getattr(w, name)
        _require(len(v) == 2 and 0 <= v[0] <= v[1] and (name == "decode_len" or v[0] >= 1), cfg,
                 f"'workload.{name}' must be [min, max] with {'1' if name == 'prompt_len' else '0'} <= min <= max, got {v}",
                 f"workload.{name}")
    for name in ("prompt_lens", "decode_lens"):
        v = getattr(w, name)
        _require(v is None or len(v) == w.requests, cfg,
                 f"'workload.{name}' has {len(v or [])} entries; needs one per request (workload.requests={w.requests})",
                 f"workload.{name}", "workload.requests")
    _require(all(x >= 1 for x in (w.prompt_lens or [1])), cfg, "'workload.prompt_lens' entries must be >= 1",
             "workload.prompt_lens")
    _require(all(x >= 0 for x in (w.decode_lens or [0])), cfg, "'workload.decode_lens' entries must be >= 0",
             "workload.decode_lens")
    _require(r.weight_format != "fp8" or r.device != "cpu", cfg,
             "'runtime.weight_format'=fp8 runs FP8 GEMMs on CUDA GPUs only; runtime.device=cpu (use bf16 there)",
             "runtime.weight_format", "runtime.device")
    _require(r.weight_format != "fp8" or m.q_lora_rank % 128 == 0, cfg,
             f"'runtime.weight_format'=fp8 fuses wq_a and wkv on 128-row scale blocks: model.q_lora_rank="
             f"{m.q_lora_rank} must be a multiple of 128", "runtime.weight_format", "model.q_lora_rank")
    _require(r.fp8_activations != "e4m3" or r.weight_format == "fp8", cfg,
             "'runtime.fp8_activations'=e4m3 rounds the inputs of FP8 GEMMs: it needs runtime.weight_format=fp8",
             "runtime.fp8_activations", "runtime.weight_format")
    _require(r.cache_format != "fp8" or r.device != "cpu", cfg,
             "'runtime.cache_format'=fp8 stores caches for the CUDA kernels only; runtime.device=cpu (use bf16 there)",
             "runtime.cache_format", "runtime.device")
    nope = m.head_dim - m.qk_rope_head_dim
    _require(r.cache_format != "fp8" or nope % 64 == 0, cfg,
             f"'runtime.cache_format'=fp8 scales the nope dims in blocks of 64: model.head_dim - model.qk_rope_head_dim "
             f"= {m.head_dim} - {m.qk_rope_head_dim} = {nope} must be a multiple of 64",
             "runtime.cache_format", "model.head_dim", "model.qk_rope_head_dim")
    _require(bool(g.capture_sizes) and all(s > 0 for s in g.capture_sizes), cfg,
             f"'graph.capture_sizes' must be a non-empty list of positive token counts, got {g.capture_sizes}",
             "graph.capture_sizes")
    _check_breakable_sizes(cfg)


def _check_breakable_sizes(cfg: RunConfig) -> None:
    """graph.breakable_capture_sizes: positive token counts, each given once (an empty list adds none)."""
    sizes = cfg.graph.breakable_capture_sizes
    bad = [s for s in sizes if s <= 0]
    _require(not bad, cfg, f"'graph.breakable_capture_sizes' must hold positive token counts, got {bad} in {sizes}",
             "graph.breakable_capture_sizes")
    twice = sorted({s for s in sizes if sizes.count(s) > 1})
    _require(not twice, cfg, f"'graph.breakable_capture_sizes' lists {twice} more than once, in {sizes}; give each "
             "size once", "graph.breakable_capture_sizes")


def breakable_sizes(cfg: RunConfig) -> list[int]:
    """The token counts breakable graphs are captured at, largest first: graph.capture_sizes and
    graph.breakable_capture_sizes together, the latter's entries above runtime.max_tokens_per_step dropped
    (no step holds that many tokens, so such a graph would cost capture time and pool memory for nothing)."""
    g, cap = cfg.graph, cfg.runtime.max_tokens_per_step
    return sorted(set(g.capture_sizes) | {s for s in g.breakable_capture_sizes if s <= cap}, reverse=True)


def eager_steps_warning(cfg: RunConfig) -> str | None:
    """Under a mode with breakable graphs, when the largest breakable size is below runtime.max_tokens_per_step:
    the line saying which steps will run eagerly; else None. `run`, `check` and the torchrun entry print it as
    one `warning:` line before any rank starts (the bench sizes its Workers itself and times such steps eagerly
    on purpose). A warning, not a refusal: those steps run correctly, only without a graph."""
    if cfg.graph.mode not in ("breakable", "full_and_breakable"):
        return None
    largest, cap = max(breakable_sizes(cfg)), cfg.runtime.max_tokens_per_step
    if largest >= cap:
        return None
    keys = ("graph.breakable_capture_sizes", "runtime.max_tokens_per_step")
    where = " and ".join(dict.fromkeys(cfg.origin(k) for k in keys))
    return (f"{where}: the largest breakable capture size is {largest} "
            f"(graph.capture_sizes {cfg.graph.capture_sizes}, graph.breakable_capture_sizes "
            f"{cfg.graph.breakable_capture_sizes}) but runtime.max_tokens_per_step={cap}: steps of {largest + 1}-{cap} "
            f"tokens run eagerly (eager_steps in the report); add sizes up to {cap} to graph.breakable_capture_sizes")


def triton_unavailable(device: str) -> str | None:
    """Why the Triton kernels cannot run for runtime.device=`device` here ('auto', 'cpu', 'cuda'), or None."""
    if device == "cpu":
        return "a CUDA device, but runtime.device=cpu"
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "the triton package, which is not installed here"
    import torch

    if not torch.cuda.is_available():
        return f"a CUDA device, and none is available here (runtime.device={device})"
    return None


def compressed_len(max_len: int, ratio: int) -> int:
    """Rows of a compressed cache: one per completed block of `ratio` tokens."""
    return math.ceil(max_len / ratio)
