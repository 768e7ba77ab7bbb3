"""Serving metrics from token timestamps: per-request latencies, their percentiles, throughput; and the
median over rounds of a setting with its spread.

Times are seconds after the setting's start (the end of the step that emitted each token, README "Serving
benchmark"). Per request of N output tokens at times t_1 <= ... <= t_N that arrived at a:

    TTFT = t_1 - a          TPOT = (t_N - t_1) / (N - 1)  (N >= 2)          E2EL = t_N - a
    ITL  = every gap t_{i+1} - t_i, pooled over the requests

Percentiles are numpy's (linear interpolation between order statistics), reported in ms with the mean. The
duration runs from the setting's start to its last token; throughputs divide by it. Beside them, as the field
reports a serving point:

    goodput                     requests meeting every limit of `Goodput` / duration (vLLM's `bench serve
                                --goodput`: a request of one output token has no TPOT and meets a TPOT limit)
    output_throughput_per_gpu   output tokens/s over the run's GPUs (one per rank)
    output_throughput_per_user  1000 / TPOT p50 in ms: the tokens/s a user sees once the first has come
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")
# Per-setting fields whose spread over rounds (min, max) the reports carry.
SPREAD_KEYS = ("request_throughput", "output_throughput", "goodput", "output_throughput_per_user", "ttft_ms_p50",
               "tpot_ms_p50", "itl_ms_p50", "duration_s")


@dataclass
class Goodput:
    """The limits (ms) a request must meet to count toward goodput; a limit left None is not checked."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms))
                if v is not None}


@dataclass
class RequestTrace:
    id: int
    prompt_len: int
    output_len: int  # tokens the request should emit
    arrival_s: float
    token_s: list[float]  # when each emitted token was done, in order

    @property
    def complete(self) -> bool:
        return len(self.token_s) == self.output_len


def latency_stats(name: str, values_s: list[float]) -> dict[str, float | None]:
    """{name}_ms_mean and _p50 / _p90 / _p99 of values in seconds (None when there are none)."""
    if not values_s:
        return {f"{name}_ms_mean": None, **{f"{name}_ms_p{p}": None for p in PERCENTILES}}
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {f"{name}_ms_mean": float(ms.mean())}
    out.update({f"{name}_ms_p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(ms, PERCENTILES))})
    return out


def _request_latencies(t: RequestTrace) -> dict[str, float | None]:
    """A completed request's TTFT, TPOT (None with one output token) and E2EL, in seconds (module doc)."""
    tpot = (t.token_s[-1] - t.token_s[0]) / (t.output_len - 1) if t.output_len > 1 else None
    return {"ttft": t.token_s[0] - t.arrival_s, "tpot": tpot, "e2el": t.token_s[-1] - t.arrival_s}


def _meets(lat: dict[str, float | None], limits: dict[str, float]) -> bool:
    """Latencies (s) within every limit (ms); no TPOT meets a TPOT limit."""
    return all(lat[k] is None or lat[k] * 1e3 <= v for k, v in limits.items())


def setting_metrics(traces: list[RequestTrace], goodput: Goodput | None = None, gpus: int = 1) -> dict:
    """Latency percentiles over the completed requests, throughput over the setting's duration; goodput (None
    without limits) and the throughputs per GPU (gpus: the run's) and per user (module doc)."""
    done = [t for t in traces if t.complete]
    lats = [_request_latencies(t) for t in done]
    ttft, e2el = [x["ttft"] for x in lats], [x["e2el"] for x in lats]
    tpot = [x["tpot"] for x in lats if x["tpot"] is not None]
    itl = [b - a for t in done for a, b in zip(t.token_s, t.token_s[1:])]
    duration = max((t.token_s[-1] for t in done), default=0.0)
    out_tokens = sum(t.output_len for t in done)
    prompt_tokens = sum(t.prompt_len for t in done)
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: None)
    out = {"requests": len(traces), "completed": len(done), "prompt_tokens": prompt_tokens,
           "output_tokens": out_tokens, "duration_s": duration, "request_throughput": rate(len(done)),
           "output_throughput": rate(out_tokens), "total_token_throughput": rate(out_tokens + prompt_tokens)}
    for name, values in zip(LATENCIES, (ttft, tpot, itl, e2el)):
        out.update(latency_stats(name, values))
    limits = goodput.limits() if goodput is not None else None
    good = None if limits is None else sum(_meets(x, limits) for x in lats)
    out["good_requests"], out["goodput"] = good, None if good is None else rate(good)
    out["output_throughput_per_gpu"] = None if out["output_throughput"] is None else out["output_throughput"] / gpus
    p50 = out["tpot_ms_p50"]
    out["output_throughput_per_user"] = 1e3 / p50 if p50 else None
    return out


def over_rounds(rounds: list[dict]) -> dict:
    """One setting's rounds -> the median of every numeric field, `spread` ({key: [min, max]} of SPREAD_KEYS)
    and `per_round` (those keys round by round). A field that is None in some round is None."""
    out = {}
    for key, first in rounds[0].items():
        if isinstance(first, bool) or not isinstance(first, (int, float)) and first is not None:
            continue
        values = [r.get(key) for r in rounds]
        if any(v is None for v in values):
            out[key] = None
        else:  # a count the same every round stays what it is (an int)
            out[key] = values[0] if len(set(values)) == 1 else statistics.median(values)
    spread, per_round = {}, {}
    for key in SPREAD_KEYS:
        values = [r.get(key) for r in rounds]
        per_round[key] = values
        spread[key] = None if any(v is None for v in values) else [min(values), max(values)]
    return {**out, "rounds": len(rounds), "spread": spread, "per_round": per_round}
