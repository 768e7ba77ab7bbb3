"""Serving benchmark configs: a base run config + a grid of loads and graph modes + `serve` settings.

    name: serve_tiny
    base: tiny.yaml                       # a run config file (beside this file, or the working directory)
    overrides: [parallel.launcher=local]  # words as on the command line, applied first
    grid:
      concurrency: [1, 4]                 # closed loop: N clients (and / or)
      rate: [20.0, 80.0]                  # open loop: Poisson arrivals, requests/s
      modes: [breakable-narrow, full_and_breakable]
    serve:
      requests: 16                        # per setting (concurrency settings: at least requests_per_client x N)
      prompt_len: {dist: uniform, min: 8, max: 40}     # N | [min, max] | {dist: fixed|uniform|normal|lognormal}
      output_len: 8
      dataset: null                       # JSONL, one {"prompt_len": P, "output_len": O} a line (replaces the two)
      repeats: 3
      warmup_per_client: 2                # before each concurrency setting: an untimed run of 2 x N requests
      goodput: {ttft_ms: 2000, tpot_ms: 50}   # limits a request must meet to count toward goodput
      output: out/serve

Command-line words `serve.*`, `grid.<key>` and `name` change the benchmark; other dotted keys change the base.
Everything is checked here, before any rank starts; errors name the key and where it came from, as config.py's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tp_runtime.bench.sweep_config import MODES
from tp_runtime.config import ConfigError, RunConfig, config_from_dict, from_mapping
from tp_runtime.memory_fit import Budget, device_budget, device_type, refusal
from tp_runtime.memory_model import rank_memory
from tp_runtime.sweep_file import read_sweep_file
from tp_runtime.serving.arrivals import (LengthSpec, ServeRequest, dataset_requests, draw_requests, parse_length,
                                         read_dataset)
from tp_runtime.serving.metrics import Goodput

GRID_KEYS = ("concurrency", "rate", "modes")
DEFAULT_MODES = ["breakable-wide", "breakable-hoisted", "breakable-narrow", "full_and_breakable"]
LENGTH_KEYS = {"prompt_len": [32, 256], "output_len": [16, 64]}  # defaults: uniform [min, max]


@dataclass
class ServeSettings:
    requests: int = 16  # requests per setting
    requests_per_client: int = 0  # concurrency settings: at least this many requests per client (0: off)
    dataset: str | None = None  # JSONL of request lengths; replaces prompt_len / output_len
    seed: int = 0  # lengths, dataset order, arrival gaps and the input hidden states
    repeats: int = 3  # rounds: every setting once per round, modes in a rotated order
    warmup_requests: int = 4  # per mode, one untimed closed-loop run before the rounds (0: none)
    warmup_per_client: int = 0  # before each concurrency-N setting, an untimed run of this x N requests (0: none)
    goodput: Goodput | None = None  # limits (ms) for goodput (None: not reported)
    in_flight: int = 2  # steps queued on the device at most: step k waits for step k - in_flight to end
    output: str = "out/serve"  # results go to <output>/<name>/
    plots: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.goodput, dict):  # from a plan (asdict) on a rank
            self.goodput = Goodput(**self.goodput)

    def warmup_for(self, load: Load) -> int:
        """Untimed requests run just before a setting of this load (closed loop only)."""
        return self.warmup_per_client * int(load.value) if load.kind == "concurrency" else 0


@dataclass(frozen=True)
class Load:
    kind: str  # "concurrency" (closed loop) | "rate" (open loop, Poisson)
    value: float

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.kind == "concurrency" else f"rate={self.value:g}/s"


@dataclass
class ServeConfig:
    name: str
    base: dict  # raw run-config mapping, base overrides applied, validated
    loads: list[Load]
    modes: list[str]
    serve: ServeSettings
    prompt: LengthSpec | None  # None with a dataset
    output: LengthSpec | None
    rows: list[tuple[int, int]] | None = None  # the dataset's (prompt_len, output_len)
    source: str = "<serve>"
    lengths: dict = field(default_factory=dict)  # how the lengths were given (for the records)
    base_file: str | None = None  # the base run config's file (None: inline)

    def worker_config(self, mode: str) -> RunConfig:
        """The RunConfig of the Worker of one graph mode (all share the base's model and runtime)."""
        data = copy.deepcopy(self.base)
        graph_mode, scope = MODES[mode]
        data["graph"] = {**data.get("graph", {}), "mode": graph_mode, "break_scope": scope}
        return config_from_dict(data, f"{self.source} (mode={mode})")

    def requests_for(self, load: Load) -> int:
        s = self.serve
        return max(s.requests, s.requests_per_client * int(load.value)) if load.kind == "concurrency" else s.requests

    def requests(self) -> list[ServeRequest]:
        """The request list every setting takes a prefix of (ids 0..n-1, the same for every setting and round)."""
        n = max([max(self.requests_for(load), self.serve.warmup_for(load)) for load in self.loads]
                + [self.serve.warmup_requests])
        if self.rows is not None:
            return dataset_requests(self.rows, n, self.serve.seed)
        return draw_requests(self.prompt, self.output, n, self.serve.seed)

    def plan(self) -> dict:
        """What every rank is given (picklable): Worker configs per mode, the settings, the request list."""
        return {"name": self.name, "serve": asdict(self.serve), "workers": {m: self.worker_config(m).to_dict()
                                                                             for m in self.modes},
                "settings": [{"mode": m, "load": load.kind, "value": load.value, "requests": self.requests_for(load),
                              "warmup": self.serve.warmup_for(load)} for load in self.loads for m in self.modes],
                "requests": [[r.prompt_len, r.output_len] for r in self.requests()], "lengths": self.lengths}


# ---------------------------------------------------------------- loading


def load_serve(path: str | Path, overrides: list[str] | None = None) -> ServeConfig:
    """Read a serve-bench YAML, apply command-line words, validate everything a launch needs."""
    path = Path(path)
    f = read_sweep_file(path, "serve-bench config", "serve", overrides)
    sc = _validated(f.name, f.base, f.grid, f.own, str(path))
    sc.base_file = f.base_file
    return sc


# ---------------------------------------------------------------- validation


def _validated(name: str, base: dict, grid: dict, raw: dict, src: str) -> ServeConfig:
    cfg = config_from_dict(base, f"{src} base")
    allowed = sorted([f.name for f in fields(ServeSettings)] + list(LENGTH_KEYS))
    unknown = sorted(set(raw) - set(allowed), key=str)
    if unknown:
        raise ConfigError(f"{src}: unknown key 'serve.{unknown[0]}'; allowed keys under 'serve': {allowed}")
    lengths = {k: raw.pop(k) for k in LENGTH_KEYS if k in raw}
    settings = from_mapping(ServeSettings, raw, "serve", src)
    _check_settings(settings, src)
    for key in ("inputs", "dump"):
        if getattr(cfg.workload, key):
            raise ConfigError(f"{src}: 'workload.{key}' is for `run`; serve-bench draws its requests from serve.*")
    loads, modes = _loads(grid, cfg, src), _modes(grid, src)
    prompt = output = rows = None
    if settings.dataset is not None:
        rows = read_dataset(settings.dataset, cfg.runtime.max_len)
        given = {"dataset": settings.dataset, "dataset_requests": len(rows)}
    else:
        prompt, output = (parse_length(lengths.get(k, d), f"serve.{k}", src) for k, d in LENGTH_KEYS.items())
        if prompt.hi + output.hi > cfg.runtime.max_len:
            raise ConfigError(f"{src}: 'serve.prompt_len' up to {prompt.hi} + 'serve.output_len' up to {output.hi} "
                              f"= {prompt.hi + output.hi} positions exceed runtime.max_len={cfg.runtime.max_len} "
                              f"(set by {cfg.origin('runtime.max_len')})")
        given = {"prompt_len": prompt.describe(), "output_len": output.describe()}
    sc = ServeConfig(name, base, loads, modes, settings, prompt, output, rows, src, given)
    for mode in modes:  # every Worker config must be valid before any rank starts
        sc.worker_config(mode)
    return sc


def _check_settings(s: ServeSettings, src: str) -> None:
    for key, least in (("requests", 1), ("repeats", 1), ("in_flight", 1), ("requests_per_client", 0),
                       ("warmup_requests", 0), ("warmup_per_client", 0)):
        if getattr(s, key) < least:
            raise ConfigError(f"{src}: 'serve.{key}' must be >= {least}, got {getattr(s, key)}")
    if s.goodput is None:
        return
    if not s.goodput.limits():
        raise ConfigError(f"{src}: 'serve.goodput' needs at least one of ttft_ms, tpot_ms, e2el_ms")
    for key, v in s.goodput.limits().items():
        if not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{src}: 'serve.goodput.{key}_ms' must be a finite number of ms > 0, got {v!r}")


def _loads(grid: dict, cfg: RunConfig, src: str) -> list[Load]:
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"{src}: unknown grid key '{unknown[0]}'; allowed grid keys: {list(GRID_KEYS)}")
    if not grid.get("concurrency") and not grid.get("rate"):
        raise ConfigError(f"{src}: the grid needs 'concurrency' (clients, closed loop) and / or 'rate' "
                          "(requests/s, Poisson arrivals): a non-empty list")
    loads = []
    for key in ("concurrency", "rate"):
        values = grid.get(key) or []
        if not isinstance(values, list):
            raise ConfigError(f"{src}: grid '{key}' must be a list, got {values!r}")
        for v in values:
            loads.append(_load(key, v, cfg, src))
    return loads


def _load(key: str, v, cfg: RunConfig, src: str) -> Load:
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if key == "rate":
        if not number or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{src}: grid 'rate' holds {v!r}; a rate must be a finite number of requests/s > 0")
        return Load("rate", float(v))
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"{src}: grid 'concurrency' holds {v!r}; a concurrency must be an integer >= 1")
    if v > cfg.runtime.max_seqs:
        raise ConfigError(f"{src}: grid 'concurrency' holds {v}, above runtime.max_seqs={cfg.runtime.max_seqs} (set by "
                          f"{cfg.origin('runtime.max_seqs')}): that many clients need that many cache slots")
    return Load("concurrency", v)


def _modes(grid: dict, src: str) -> list[str]:
    modes = grid.get("modes", DEFAULT_MODES)
    if not isinstance(modes, list) or not modes:
        raise ConfigError(f"{src}: grid 'modes' must be a non-empty list, got {modes!r}")
    bad = [m for m in modes if m not in MODES]
    if bad or len(set(modes)) != len(modes):
        raise ConfigError(f"{src}: grid 'modes' holds {bad or modes}; allowed modes (each once, one shard for "
                          f"all): {list(MODES)}")
    return list(modes)


def check_serve_memory(sc: ServeConfig) -> None:
    """Refuse a benchmark whose ranks cannot hold one shard (weights, caches) and a Worker workspace per mode on
    this machine's devices (memory_fit.py); on a CPU the ranks of the group share the host."""
    cfg = sc.worker_config(sc.modes[0])
    kind = device_type(cfg)
    budget = device_budget(cfg, kind)
    if budget is None:
        return
    mems = [rank_memory(sc.worker_config(m), kind) for m in sc.modes]
    parts = {"weights": mems[0]["weights"], "caches": mems[0]["caches"],
             "workspace": sum(m["workspace"] for m in mems)}
    what = f"each rank ({len(sc.modes)} mode(s) on one shard)"
    if budget.ranks_here > 1:
        parts = {k: v * budget.ranks_here for k, v in parts.items()}
        budget, what = Budget(budget.bytes, budget.what, 1), f"the {cfg.parallel.tp} ranks ({len(sc.modes)} mode(s))"
    if msg := refusal(cfg, parts, budget, what):
        raise ConfigError(msg)
