"""The per-rank entry of `serve-bench`, run by every launcher (the local launcher's elastic agent, Ray actors,
the processes torchrun started) as `engine.entry.worker_entry` is for `run`:

    serve_entry(cfg_dict, plan) -> rank 0's round records (None elsewhere)

Every rank joins the group, builds one Worker per graph mode on one shared ModelShard (weights and caches once;
the first Worker builds it), runs a short untimed closed-loop warm-up per mode, then `repeats` rounds: each round
runs every (mode, load) setting once, loads in grid order and the modes of each load in an order rotated by the
round's index, so every mode runs first, second, ... equally often and the modes of one load run back to back.
A concurrency-N setting is preceded by an untimed run of serve.warmup_per_client x N requests at N clients.
A peer that stops answering is named and ended as under `run` (parallel/peer_watch.py).
"""

from __future__ import annotations

import hashlib
import sys

from tqdm import tqdm

from tp_runtime.config import config_from_dict
from tp_runtime.engine.session import RankSession
from tp_runtime.engine.workload import Workload
from tp_runtime.executor.timing import timer_name
from tp_runtime.executor.worker import Worker
from tp_runtime.serving.arrivals import ServeRequest, poisson_offsets
from tp_runtime.serving.config import Load, ServeSettings
from tp_runtime.serving.source import Setting, SettingResult, run_setting
from tp_runtime.serving.metrics import setting_metrics


def serve_entry(cfg_dict: dict, plan: dict) -> list[dict] | None:
    """Every rank: join the group (RANK set) or run tp = 1 here, build the Workers, run warm-ups and rounds."""
    cfg = config_from_dict(cfg_dict)
    with RankSession(cfg) as session:
        workers = _build_workers(plan, session)
        s = ServeSettings(**plan["serve"])
        rank0 = session.tp.rank == 0
        bar = tqdm(total=s.repeats * len(plan["settings"]) + len(workers) * bool(s.warmup_requests),
                   unit="setting", file=sys.stderr, desc=f"serve-bench {plan['name']}", disable=not rank0,
                   dynamic_ncols=True)
        try:
            records = _run_rounds(plan, s, workers, rank0, bar)
        finally:
            bar.close()
        return records if rank0 else None


def _run_rounds(plan: dict, s: ServeSettings, workers: dict[str, Worker], rank0: bool, bar: tqdm) -> list[dict]:
    """The warm-up of every mode, then every round's settings in their rotated order; rank 0's records."""
    requests = [ServeRequest(i, pl, ol) for i, (pl, ol) in enumerate(plan["requests"])]
    inputs = Workload([], next(iter(workers.values())).cfg.model.hidden_size, s.seed)  # staging reused throughout
    for w in workers.values() if s.warmup_requests else ():
        n = s.warmup_requests
        run_setting(w, w.tp, Setting(requests[:n], concurrency=min(n, w.cfg.runtime.max_seqs)), inputs, s.in_flight)
        bar.update()
    runs = [(r, setting) for r in range(s.repeats) for setting in round_order(plan["settings"], r, len(workers))]
    records = []
    for pos, (r, setting) in enumerate(runs):
        w = workers[setting["mode"]]
        bar.set_postfix_str(f"round {r + 1}/{s.repeats} {setting['mode']} "
                            f"{Load(setting['load'], setting['value']).label}")
        if setting["warmup"]:  # untimed, at the setting's own concurrency
            run_setting(w, w.tp, Setting(requests[:setting["warmup"]], concurrency=int(setting["value"])), inputs,
                        s.in_flight)
        arrive = _arrivals(setting, requests, s.seed)
        res = run_setting(w, w.tp, arrive if rank0 else None, inputs, s.in_flight)
        if res is not None:
            records.append(_record(plan, s, w, setting, r, pos, arrive, res))
        bar.update()
    return records


def _build_workers(plan: dict, session: RankSession) -> dict[str, Worker]:
    """One Worker per mode, held by the session as they are built (it frees them on any failure); the first
    builds the shard (and the group's all-reduce), the others capture their graphs on it."""
    workers: dict[str, Worker] = {}
    shard = None
    for mode, d in plan["workers"].items():
        cfg = config_from_dict(d, f"{plan['name']} {mode}")
        w = session.worker(cfg, None if shard is None else shard.tp, shard=shard)
        workers[mode], shard = w, w.shard
    return workers


def round_order(settings: list[dict], r: int, n_modes: int) -> list[dict]:
    """Round r's order: the settings (load-major, modes inner) with each load's modes rotated by r."""
    out = []
    for i in range(0, len(settings), n_modes):
        block = settings[i: i + n_modes]
        k = r % len(block)
        out += block[k:] + block[:k]
    return out


def _arrivals(setting: dict, requests: list[ServeRequest], seed: int) -> Setting:
    reqs = requests[: setting["requests"]]
    if setting["load"] == "concurrency":
        return Setting(reqs, concurrency=int(setting["value"]))
    return Setting(reqs, offsets=poisson_offsets(len(reqs), setting["value"], seed))


def _digest(arrive: Setting) -> str:
    """Names the requests a run was given: ids, lengths, and open-loop arrival offsets (to the nanosecond)."""
    rows = [(r.id, r.prompt_len, r.output_len) for r in arrive.requests]
    offsets = [round(t, 9) for t in arrive.offsets] if arrive.offsets is not None else arrive.concurrency
    return hashlib.sha256(repr((rows, offsets)).encode()).hexdigest()[:16]


def _record(plan: dict, s: ServeSettings, w: Worker, setting: dict, r: int, pos: int, arrive: Setting,
            res: SettingResult) -> dict:
    cfg, kind, value = w.cfg, setting["load"], setting["value"]
    return {"kind": "round", "name": plan["name"], "round": r, "position": pos, "mode": setting["mode"],
            "graph_mode": cfg.graph.mode, "break_scope": cfg.graph.break_scope, "load": kind, "value": value,
            "concurrency": int(value) if kind == "concurrency" else None,
            "rate": value if kind == "rate" else None,
            "label": Load(kind, value).label,
            "tp": w.tp.size, "launcher": cfg.parallel.launcher, "device": str(w.device),
            "dtype": str(w.dtype).removeprefix("torch."), "kernels": w.stack.kernels, "timer": timer_name(w.device),
            "in_flight": s.in_flight, "seed": s.seed, "graph_captured": bool(w.graph_sets),
            "capture_sizes": sorted(cfg.graph.capture_sizes, reverse=True), **plan.get("lengths", {}),
            "warmup_requests": setting["warmup"], "goodput_limits_ms": s.goodput.limits() if s.goodput else None,
            "request_digest": _digest(arrive), "order_digest": res.order_digest, "order_head": res.order[:16],
            "metrics": setting_metrics(res.traces, s.goodput, w.tp.size), "steps": res.steps,
            "decode_steps": res.decode_steps,
            "decode_eager_steps": res.decode_eager_steps, "steps_by_path": res.steps_by_path,
            "max_running": res.max_running, "idle_waits": res.idle_waits, "outputs_finite": res.outputs_finite,
            "wall_s": res.wall_s}
