"""What arrives and when: request lengths (seeded distributions or a JSONL file) and arrival times (a Poisson
process at a rate, or a closed loop of clients).

    prompt = parse_length({"dist": "uniform", "min": 8, "max": 64}, "serve.prompt_len", source)
    requests = draw_requests(prompt, output, n, seed)         # or dataset_requests(rows, n, seed)
    offsets = poisson_offsets(n, rate, seed)                  # seconds after the setting's start; request 0 at 0
    source = OpenLoop(requests, offsets) | ClosedLoop(requests, concurrency)

Every quantity draws from its own stream (random.Random keyed by a string: the same values on every platform
and Python version), so the same seed gives the same request order, lengths and arrival offsets, a change of
rate leaves the lengths alone, and every rate scales the same standard exponential gaps by 1 / rate.

A request of output length N costs prompt_len + N - 1 positions: its prefill emits token 1 and each of N - 1
decode steps one more (the last token is never fed back), as a server's would.
"""

from __future__ import annotations

import json
import math
import os
import random
import stat
from dataclasses import dataclass
from pathlib import Path

from tp_runtime.config import ConfigError

# dist -> (required keys, optional keys); `min` / `max` clip what a normal or lognormal draw gives.
DISTS = {"fixed": (("value",), ()), "uniform": (("min", "max"), ()),
         "normal": (("mean", "std"), ("min", "max")), "lognormal": (("median", "sigma"), ("min", "max"))}
TAIL_SIGMAS = 4  # a normal / lognormal without `max` is clipped this many sigmas above its centre


@dataclass(frozen=True)
class ServeRequest:
    id: int
    prompt_len: int
    output_len: int  # tokens the request emits (>= 1)


@dataclass(frozen=True)
class LengthSpec:
    """A length distribution: every draw is an int in [lo, hi]."""

    dist: str
    lo: int
    hi: int
    center: float = 0.0  # normal: mean; lognormal: median
    scale: float = 0.0  # normal: std; lognormal: sigma of the log

    def draw(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            return self.lo
        if self.dist == "uniform":
            return rng.randint(self.lo, self.hi)
        v = rng.gauss(self.center, self.scale) if self.dist == "normal" else \
            self.center * math.exp(rng.gauss(0.0, self.scale))
        return min(self.hi, max(self.lo, round(v)))

    def describe(self) -> dict:
        out = {"dist": self.dist, "min": self.lo, "max": self.hi}
        if self.dist in ("normal", "lognormal"):
            out.update({"mean" if self.dist == "normal" else "median": self.center,
                        "std" if self.dist == "normal" else "sigma": self.scale})
        return out


def _number(spec: dict, name: str, key: str, source: str, integer: bool) -> float:
    v = spec[name]
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or not math.isfinite(v):
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(f"{source}: '{key}.{name}' must be {kind}, got {v!r}")
    return v


def parse_length(value, key: str, source: str) -> LengthSpec:
    """A length setting: N (fixed), [min, max] (uniform), or {dist: fixed | uniform | normal | lognormal, ...}."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"dist": "fixed", "value": value}
    elif isinstance(value, list):
        if len(value) != 2:
            raise ConfigError(f"{source}: '{key}' as a list must be [min, max], got {value!r}")
        value = {"dist": "uniform", "min": value[0], "max": value[1]}
    if not isinstance(value, dict) or value.get("dist") not in DISTS:
        raise ConfigError(f"{source}: '{key}' must be an integer, [min, max] or a mapping with 'dist' one of "
                          f"{list(DISTS)}, got {value!r}")
    dist = value["dist"]
    required, optional = DISTS[dist]
    unknown = sorted(set(value) - {"dist", *required, *optional})
    missing = [k for k in required if k not in value]
    if unknown or missing:
        what = f"unknown key '{key}.{unknown[0]}'" if unknown else f"missing '{key}.{missing[0]}'"
        raise ConfigError(f"{source}: {what}; dist={dist} takes {list(required)}"
                          f"{f' and optionally {list(optional)}' if optional else ''}")
    if dist == "fixed":
        lo = hi = int(_number(value, "value", key, source, True))
        return _bounded(LengthSpec(dist, lo, hi), key, source)
    if dist == "uniform":
        lo, hi = (int(_number(value, k, key, source, True)) for k in ("min", "max"))
        return _bounded(LengthSpec(dist, lo, hi), key, source)
    center, scale = (float(_number(value, k, key, source, False)) for k in required)
    if scale < 0 or (dist == "lognormal" and center <= 0):
        median = " and median > 0" if dist == "lognormal" else ""
        raise ConfigError(f"{source}: '{key}' needs {required[1]} >= 0{median}, got {required[0]}={center:g}, "
                          f"{required[1]}={scale:g}")
    top = center + TAIL_SIGMAS * scale if dist == "normal" else center * math.exp(TAIL_SIGMAS * scale)
    lo = int(_number(value, "min", key, source, True)) if "min" in value else 1
    hi = int(_number(value, "max", key, source, True)) if "max" in value else max(lo, math.ceil(top))
    return _bounded(LengthSpec(dist, lo, hi, center, scale), key, source)


def _bounded(spec: LengthSpec, key: str, source: str) -> LengthSpec:
    if not 1 <= spec.lo <= spec.hi:
        raise ConfigError(f"{source}: '{key}' draws lengths in [{spec.lo}, {spec.hi}]; needs 1 <= min <= max")
    return spec


def draw_requests(prompt: LengthSpec, output: LengthSpec, n: int, seed: int) -> list[ServeRequest]:
    """n requests with ids 0..n-1; prompt and output lengths from their own seeded streams."""
    rp, ro = random.Random(f"serve:{seed}:prompt"), random.Random(f"serve:{seed}:output")
    return [ServeRequest(i, prompt.draw(rp), output.draw(ro)) for i in range(n)]


def dataset_requests(rows: list[tuple[int, int]], n: int, seed: int) -> list[ServeRequest]:
    """n requests from a dataset's (prompt_len, output_len) rows: the rows in a seeded order, cycled."""
    order = list(range(len(rows)))
    random.Random(f"serve:{seed}:dataset").shuffle(order)
    return [ServeRequest(i, *rows[order[i % len(rows)]]) for i in range(n)]


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of n requests of a Poisson process at `rate` requests/s: request 0 at 0, then
    exponential gaps of mean 1 / rate (the same standard draws for every rate)."""
    rng = random.Random(f"serve:{seed}:arrivals")
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(1.0) / rate
    return out


# ---------------------------------------------------------------- a JSONL dataset


def read_dataset(path: str, max_len: int, key: str = "serve.dataset") -> list[tuple[int, int]]:
    """(prompt_len, output_len) per line of a JSONL file: one object a line with integer 'prompt_len' and
    'output_len' >= 1 (other keys, such as the text, are ignored; none given twice); blank lines are skipped. A
    line that breaks this, or needs more than max_len positions (prompt + output), is refused with FILE:LINE."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{key}={path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{key}={path} is not a regular file")
    rows = []
    try:
        with Path(path).open(encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_dataset_row(line, f"{path}:{no}", max_len))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}={path} is not UTF-8 text (byte {e.start} of a line)") from None
    except OSError as e:
        raise ConfigError(f"{key}={path} cannot be read: {e.strerror}") from None
    if not rows:
        raise ConfigError(f"{key}={path} is empty: it needs one JSON object a line with 'prompt_len' and "
                          "'output_len'")
    return rows


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object of a dataset line."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: the object, unless a key is given twice (json.loads would keep the last)."""
    obj: dict = {}
    for k, v in pairs:
        if k in obj:
            raise _DuplicateKey(k)
        obj[k] = v
    return obj


def _dataset_row(line: str, where: str, max_len: int) -> tuple[int, int]:
    try:
        obj = json.loads(line, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    except _DuplicateKey as e:
        raise ConfigError(f"{where}: key '{e}' is given twice in one object; give each key once") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deeply (a line is one flat object)") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be a JSON object with 'prompt_len' and 'output_len', got {line.strip()[:60]}")
    for name in ("prompt_len", "output_len"):
        if name not in obj:
            raise ConfigError(f"{where}: missing '{name}' (each line needs integer 'prompt_len' and 'output_len')")
        v = obj[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{where}: '{name}' must be an integer >= 1, got {v!r}")
    p, o = obj["prompt_len"], obj["output_len"]
    if p + o > max_len:
        raise ConfigError(f"{where}: prompt_len + output_len = {p} + {o} = {p + o} exceeds runtime.max_len={max_len}")
    return p, o


# ---------------------------------------------------------------- who arrives when


@dataclass(frozen=True)
class Arrival:
    """When a request arrived: `at_s` after the setting's start, or at the end of step `after_step` (a closed
    loop's client sends its next request as the previous one's last token is done)."""

    at_s: float = 0.0
    after_step: int | None = None

    def resolve(self, step_end_s: list[float]) -> float:
        return step_end_s[self.after_step] if self.after_step is not None else self.at_s


class OpenLoop:
    """Requests arriving at fixed offsets, whatever the server does (a Poisson process at a rate)."""

    def __init__(self, requests: list[ServeRequest], offsets: list[float]):
        self.requests, self.offsets, self._next = requests, offsets, 0

    def due(self, now_s: float) -> list[tuple[ServeRequest, Arrival]]:
        """The requests whose arrival offset has come by now_s, in arrival order."""
        out = []
        while self._next < len(self.requests) and self.offsets[self._next] <= now_s:
            out.append((self.requests[self._next], Arrival(self.offsets[self._next])))
            self._next += 1
        return out

    def next_at(self) -> float | None:
        """Offset of the next request to arrive; None when all have."""
        return self.offsets[self._next] if self._next < len(self.requests) else None

    def finished(self, ids: list[int], step: int) -> None:
        """Completions change nothing in an open loop."""


class ClosedLoop:
    """`concurrency` clients: requests 0..concurrency-1 arrive at the start, and as each request finishes its
    client sends the next one (in request order) at once, so at most `concurrency` are ever outstanding."""

    def __init__(self, requests: list[ServeRequest], concurrency: int):
        self.requests, self.concurrency = requests, concurrency
        first = min(concurrency, len(requests))
        self._ready = [(r, Arrival(0.0)) for r in requests[:first]]
        self._next, self.outstanding = first, 0

    def due(self, now_s: float) -> list[tuple[ServeRequest, Arrival]]:
        out, self._ready = self._ready, []
        self.outstanding += len(out)
        return out

    def next_at(self) -> float | None:
        """Never waits: a successor is due the moment its predecessor finishes (None: nothing scheduled)."""
        return 0.0 if self._ready else None

    def finished(self, ids: list[int], step: int) -> None:
        """Requests that finished in `step`: each client sends its next request, arriving at that step's end."""
        self.outstanding -= len(ids)
        for _ in ids:
            if self._next < len(self.requests):
                self._ready.append((self.requests[self._next], Arrival(after_step=step)))
                self._next += 1
