"""Cross-field checks of a built RunConfig, section by section, and the warning about eagerly run steps.

validate() runs on every load (load_config, config_from_dict): the shapes the math needs, tp divisibility,
value ranges, workload and runtime bounds, and what the device must support (device_checks.py). Each
refusal is a ConfigError beginning with where the offending values came from (the file, an override word).
"""

from __future__ import annotations

import math

from tp_runtime.config.device_checks import check_fp8_formats, check_kernels, check_pdl
from tp_runtime.config.schema import RunConfig, breakable_sizes
from tp_runtime.config_yaml import ConfigError

# Longest accepted timeout: longer ones overflow the timedelta / millisecond counts the process groups,
# the rendezvous store and the heartbeat are given (1e300 is finite), and a week already means "never".
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Shortest accepted collective timeout: below a second, a rank's ordinary wait for its peer (a step of the
# slowest rank, a weight load) already exceeds it, so the run would fail as if a rank were lost.
MIN_TIMEOUT_S = 1.0
# A window this many times runtime.max_len is refused: no position at or past max_len is ever cached, so its
# rows beyond max_len are allocated and never written. Up to this factor is accepted, so a released config
# (Flash's window of 128) still runs at a short max_len (64) for a quick test.
WINDOW_OVER_MAX_LEN = 2
# Seeds are hashed as int64 (weights/seeded.py): a larger one cannot be drawn from.
SEED_RANGE = (-2**63, 2**63 - 1)
# Workload keys that describe drawn requests; a workload.inputs file gives its own requests and lengths.
DRAWN_WORKLOAD_KEYS = ("requests", "prompt_len", "prompt_lens", "decode_len", "decode_lens")

POSITIVE_MODEL_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
                       "o_groups", "o_lora_rank", "sliding_window", "index_n_heads", "index_head_dim", "index_topk")
POSITIVE_RUNTIME_KEYS = ("max_seqs", "max_len", "max_tokens_per_step", "prefill_chunk")


def validate(cfg: RunConfig) -> None:
    """Cross-field checks: shapes the math needs, tp divisibility, value ranges, workload and runtime bounds."""
    _check_ranges(cfg)
    _check_model(cfg)
    _check_parallel(cfg)
    _check_runtime(cfg)
    _check_workload(cfg)
    _check_formats(cfg)
    _check_graph(cfg)


def _require(cond: bool, cfg: RunConfig, msg: str, *keys: str) -> None:
    """Refuse with msg, naming where the values of `keys` came from (the file, an override word)."""
    if not cond:
        raise ConfigError(f"{cfg.where(*keys)}: {msg}")


def _number_in(cfg: RunConfig, key: str, value: float, lo: float, hi: float = math.inf, lo_open: bool = True,
               why: str = "") -> None:
    """Refuse a value that is not finite or lies outside (lo, hi] ([lo, hi] when not lo_open)."""
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
    _require(ok, cfg, f"'{key}' must be a finite number {bound}{why}, got {value!r}", key)


def _check_ranges(cfg: RunConfig) -> None:
    """Value ranges the math and the launchers need: rope / YaRN settings, eps, timeouts, seeds."""
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
    _require(p.timeout_s >= MIN_TIMEOUT_S, cfg, f"'parallel.timeout_s'={p.timeout_s:g} is below the shortest "
             f"collective timeout, {MIN_TIMEOUT_S:g} s: ranks wait that long for each other in ordinary steps",
             "parallel.timeout_s")
    for key, seed in (("runtime.seed", cfg.runtime.seed), ("workload.seed", cfg.workload.seed)):
        lo, hi = SEED_RANGE
        _require(lo <= seed <= hi, cfg, f"'{key}'={seed} lies outside int64 [{lo}, {hi}], the range seeds are "
                 "hashed in", key)


def _check_model(cfg: RunConfig) -> None:
    """The shapes the math needs: positive dims, the rotary dims, o_groups, a ratio per layer, the layer list."""
    m = cfg.model
    for name in POSITIVE_MODEL_KEYS:
        _require(getattr(m, name) > 0, cfg, f"'model.{name}' must be positive, got {getattr(m, name)}", f"model.{name}")
    _require(0 < m.qk_rope_head_dim <= min(m.head_dim, m.index_head_dim) and m.qk_rope_head_dim % 2 == 0, cfg,
             f"'model.qk_rope_head_dim'={m.qk_rope_head_dim} must be even and at most head_dim and index_head_dim",
             "model.qk_rope_head_dim", "model.head_dim", "model.index_head_dim")
    for name in ("head_dim", "index_head_dim"):  # the rotary pairs (2i, 2i+1) of the last Dr dims start even
        _require(getattr(m, name) % 2 == 0, cfg, f"'model.{name}'={getattr(m, name)} must be even: the rotary "
                 "turns pairs of dims, which must start at an even offset of each row", f"model.{name}")
    _require(m.num_attention_heads % m.o_groups == 0, cfg,
             f"'model.o_groups'={m.o_groups} must divide num_attention_heads={m.num_attention_heads}",
             "model.o_groups", "model.num_attention_heads")
    _require(len(m.compress_ratios) >= m.num_hidden_layers, cfg,
             f"'model.compress_ratios' has {len(m.compress_ratios)} entries; needs one per layer "
             f"(num_hidden_layers={m.num_hidden_layers})", "model.compress_ratios", "model.num_hidden_layers")
    bad = sorted({x for x in m.compress_ratios if x not in (0, 4, 128)})
    _require(not bad, cfg, f"'model.compress_ratios' holds {bad}; allowed ratios: [0, 4, 128]",
             "model.compress_ratios")
    try:
        m.layer_ids()
    except ConfigError as e:
        raise ConfigError(f"{cfg.origin('model.layers')}: {e}") from None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_parallel(cfg: RunConfig) -> None:
    """tp divides the heads and o_groups; fault injection names a rank; symmetric memory only on CUDA / NCCL."""
    m, p, r = cfg.model, cfg.parallel, cfg.runtime
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


def _check_runtime(cfg: RunConfig) -> None:
    """Positive sizes, the kernels and PDL the device can run, a window within reach of max_len, and a step budget
    every sequence fits."""
    r = cfg.runtime
    for name in POSITIVE_RUNTIME_KEYS:
        _require(getattr(r, name) > 0, cfg, f"'runtime.{name}' must be positive, got {getattr(r, name)}",
                 f"runtime.{name}")
    _require(r.kernels != "triton" or r.dtype != "float64", cfg,
             "'runtime.kernels'=triton runs bfloat16 and float32; runtime.dtype=float64 needs runtime.kernels=torch "
             "(or auto)", "runtime.kernels", "runtime.dtype")
    check_kernels(cfg)
    check_pdl(cfg)
    w = cfg.model.sliding_window
    _require(w <= WINDOW_OVER_MAX_LEN * r.max_len, cfg,
             f"'model.sliding_window'={w} is more than {WINDOW_OVER_MAX_LEN}x runtime.max_len={r.max_len}: positions "
             f"past max_len are never cached, so the window's extra rows would only take memory; raise "
             f"runtime.max_len or lower model.sliding_window to at most {WINDOW_OVER_MAX_LEN * r.max_len}",
             "model.sliding_window", "runtime.max_len")
    _require(r.max_tokens_per_step >= r.max_seqs, cfg,
             f"'runtime.max_tokens_per_step'={r.max_tokens_per_step} must be at least runtime.max_seqs={r.max_seqs} "
             "so every running sequence can decode each step", "runtime.max_tokens_per_step", "runtime.max_seqs")


def _check_workload(cfg: RunConfig) -> None:
    """Request count, [min, max] length ranges, explicit lengths (one per request, in range); none of them set
    beside workload.inputs."""
    w = cfg.workload
    if w.inputs:
        _check_inputs_alone(cfg)
    _require(w.requests >= 0, cfg, f"'workload.requests' must be >= 0, got {w.requests}", "workload.requests")
    for name, lo in (("prompt_len", 1), ("decode_len", 0)):
        v = getattr(w, name)
        _require(len(v) == 2 and lo <= v[0] <= v[1], cfg,
                 f"'workload.{name}' must be [min, max] with {lo} <= min <= max, got {v}", f"workload.{name}")
    for name in ("prompt_lens", "decode_lens"):
        v = getattr(w, name)
        _require(v is None or len(v) == w.requests, cfg,
                 f"'workload.{name}' has {len(v or [])} entries; needs one per request (workload.requests="
                 f"{w.requests})", f"workload.{name}", "workload.requests")
    _require(all(x >= 1 for x in (w.prompt_lens or [1])), cfg, "'workload.prompt_lens' entries must be >= 1",
             "workload.prompt_lens")
    _require(all(x >= 0 for x in (w.decode_lens or [0])), cfg, "'workload.decode_lens' entries must be >= 0",
             "workload.decode_lens")


def _check_inputs_alone(cfg: RunConfig) -> None:
    """With workload.inputs, the drawn workload's keys are refused where they were set on purpose: by a command-line
    word, or by the file that sets workload.inputs itself (the file's requests and lengths replace them). A config
    file's drawn workload with workload.inputs given on the command line is what the file offers, not refused."""
    inputs_from = cfg.origins.get("workload.inputs")
    for name in DRAWN_WORKLOAD_KEYS:
        key = f"workload.{name}"
        origin = cfg.origins.get(key)
        if origin is not None and (origin != cfg.source or inputs_from == cfg.source):
            raise ConfigError(f"{cfg.where(key, 'workload.inputs')}: '{key}' and 'workload.inputs' are both given; "
                              f"the inputs file {cfg.workload.inputs} sets the requests and their lengths: drop {key}")


def _check_formats(cfg: RunConfig) -> None:
    """FP8 weights and caches: a CUDA device, and the block sizes their scales need."""
    m, r = cfg.model, cfg.runtime
    check_fp8_formats(cfg)
    _require(r.weight_format != "fp8" or m.q_lora_rank % 128 == 0, cfg,
             f"'runtime.weight_format'=fp8 fuses wq_a and wkv on 128-row scale blocks: model.q_lora_rank="
             f"{m.q_lora_rank} must be a multiple of 128", "runtime.weight_format", "model.q_lora_rank")
    _require(r.fp8_activations != "e4m3" or r.weight_format == "fp8", cfg,
             "'runtime.fp8_activations'=e4m3 rounds the inputs of FP8 GEMMs: it needs runtime.weight_format=fp8",
             "runtime.fp8_activations", "runtime.weight_format")
    nope = m.head_dim - m.qk_rope_head_dim
    _require(r.cache_format != "fp8" or nope % 64 == 0, cfg,
             "'runtime.cache_format'=fp8 scales the nope dims in blocks of 64: model.head_dim - "
             f"model.qk_rope_head_dim = {m.head_dim} - {m.qk_rope_head_dim} = {nope} must be a multiple of 64",
             "runtime.cache_format", "model.head_dim", "model.qk_rope_head_dim")


def _check_graph(cfg: RunConfig) -> None:
    """Capture sizes: positive token counts, each given once (an empty breakable list adds none)."""
    g = cfg.graph
    _require(bool(g.capture_sizes) and all(s > 0 for s in g.capture_sizes), cfg,
             f"'graph.capture_sizes' must be a non-empty list of positive token counts, got {g.capture_sizes}",
             "graph.capture_sizes")
    sizes = g.breakable_capture_sizes
    bad = [s for s in sizes if s <= 0]
    _require(not bad, cfg, f"'graph.breakable_capture_sizes' must hold positive token counts, got {bad} in {sizes}",
             "graph.breakable_capture_sizes")
    for key, sizes in (("graph.capture_sizes", g.capture_sizes), ("graph.breakable_capture_sizes", sizes)):
        twice = sorted({s for s in sizes if sizes.count(s) > 1})
        _require(not twice, cfg, f"'{key}' lists {twice} more than once, in {sizes}; give each size once", key)


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
    return (f"{cfg.where('graph.breakable_capture_sizes', 'runtime.max_tokens_per_step')}: the largest breakable "
            f"capture size is {largest} (graph.capture_sizes {cfg.graph.capture_sizes}, graph.breakable_capture_sizes "
            f"{cfg.graph.breakable_capture_sizes}) but runtime.max_tokens_per_step={cap}: steps of {largest + 1}-{cap} "
            f"tokens run eagerly (eager_steps in the report); add sizes up to {cap} to graph.breakable_capture_sizes")
