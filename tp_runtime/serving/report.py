"""Serving benchmark outputs: one record per setting (medians over rounds with their spread), the text table,
JSON lines and the summary.

    <output>/<name>/settings.jsonl   one record per (mode, load): medians over rounds, spread, per-round values
    <output>/<name>/rounds.jsonl     one record per (round, mode, load) as measured
    <output>/<name>/summary.json     what ran, where, and the files
    <output>/<name>/*.png            plots.py

Each is written atomically (paths.atomic_output) into <name>/unfinished/, and a finished run moves them all up
together (results_folder.py), so the folder never mixes two runs' files; stdout gets the table, one strict JSON
line per setting, and the summary as its last line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tp_runtime.engine.report import strict_json
from tp_runtime.paths import atomic_output, write_text_atomic
from tp_runtime.serving.metrics import over_rounds

PLOT_FILES = ("ttft_vs_throughput.png", "tpot_vs_throughput.png")
OUTPUT_FILES = ("settings.jsonl", "rounds.jsonl", "summary.json", *PLOT_FILES)
# Fields that say what a setting is and how it ran; equal in every round, copied from the first.
SETTING_FIELDS = ("name", "mode", "graph_mode", "break_scope", "load", "concurrency", "rate", "label", "tp",
                  "launcher", "device", "dtype", "kernels", "timer", "in_flight", "seed", "graph_captured",
                  "capture_sizes", "warmup_requests", "goodput_limits_ms", "request_digest", "order_digest",
                  "prompt_len", "output_len", "dataset", "dataset_requests")


def settings_records(rounds: list[dict]) -> list[dict]:
    """Round records -> one record per setting (in the order settings first appear): its fields, the median of
    every metric over rounds, `spread` and `per_round`; counts that must hold every round are and-ed / summed."""
    keys: dict[tuple, list[dict]] = {}
    for r in rounds:
        keys.setdefault((r["mode"], r["load"], r["value"]), []).append(r)
    out = []
    for group in keys.values():
        first = group[0]
        rec = {"kind": "setting", **{k: first[k] for k in SETTING_FIELDS if k in first}}
        rec.update(over_rounds([r["metrics"] for r in group]))
        rec["outputs_finite"] = all(r["outputs_finite"] for r in group)
        rec["same_requests_every_round"] = len({r["request_digest"] for r in group}) == 1
        for key in ("steps", "decode_steps", "decode_eager_steps", "idle_waits"):  # over every round
            rec[key] = sum(r[key] for r in group)
        rec["steps_by_path"] = _summed([r["steps_by_path"] for r in group])
        rec["max_running"] = max(r["max_running"] for r in group)
        out.append(rec)
    return out


def _summed(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, tmp.open("w") as f:
        f.writelines(strict_json(row) + "\n" for row in rows)


def write_outputs(out_dir: Path, rounds: list[dict], settings: list[dict]) -> list[str]:
    write_jsonl(out_dir / "rounds.jsonl", rounds)
    write_jsonl(out_dir / "settings.jsonl", settings)
    return ["settings.jsonl", "rounds.jsonl"]


def summary(name: str, config: str, overrides: list[str], settings: list[dict], out_dir: Path, files: list[str],
            wall_s: float) -> dict:
    first = settings[0] if settings else {}
    return {"command": "serve-bench", "name": name, "config": config, "overrides": overrides,
            "settings": len(settings), "rounds": first.get("rounds"), "output": str(out_dir), "files": files,
            **{k: first.get(k) for k in ("tp", "launcher", "device", "dtype", "kernels", "timer", "in_flight")},
            "modes": list(dict.fromkeys(s["mode"] for s in settings)),
            "loads": list(dict.fromkeys(s["label"] for s in settings)),
            "all_outputs_finite": all(s["outputs_finite"] for s in settings),
            "all_completed": all(s["completed"] == s["requests"] for s in settings), "wall_s": round(wall_s, 2)}


def write_summary(out_dir: Path, summ: dict) -> None:
    write_text_atomic(out_dir / "summary.json", json.dumps(summ, indent=2) + "\n")


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def _rate(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(settings: list[dict]) -> str:
    """One row per setting: throughput (all, per GPU, per user), goodput, latency percentiles (medians over rounds)
    and the throughput spread."""
    head = (f"{'mode':20s} {'load':>12s} {'req':>5s} {'req/s':>7s} {'good/s':>7s} {'out tok/s':>10s} "
            f"{'(min-max)':>15s} {'/GPU':>8s} {'/user':>7s} "
            f"{'TTFT p50':>9s} {'p90':>8s} {'p99':>8s} {'TPOT p50':>9s} {'p90':>8s} {'p99':>8s} "
            f"{'ITL p50':>8s} {'p99':>8s}  (ms)")
    rows = [head, "-" * len(head)]
    for s in settings:
        lo_hi = s["spread"]["output_throughput"]
        spread = f"({_rate(lo_hi[0])}-{_rate(lo_hi[1])})" if lo_hi else "-"
        rows.append(f"{s['mode']:20s} {s['label']:>12s} {int(s['completed']):>5d} {_rate(s['request_throughput']):>7s} "
                    f"{_rate(s['goodput']):>7s} {_rate(s['output_throughput']):>10s} {spread:>15s} "
                    f"{_rate(s['output_throughput_per_gpu']):>8s} {_rate(s['output_throughput_per_user']):>7s} "
                    + " ".join(f"{_ms(s[f'{m}_ms_p{p}']):>{9 if p == 50 and m != 'itl' else 8}s}"
                               for m in ("ttft", "tpot") for p in (50, 90, 99))
                    + f" {_ms(s['itl_ms_p50']):>8s} {_ms(s['itl_ms_p99']):>8s}")
    return "\n".join(rows)


def print_results(settings: list[dict], summ: dict) -> None:
    rounds = summ.get("rounds")
    print(f"tp_runtime serve-bench {summ['name']}: tp={summ['tp']} launcher={summ['launcher']} device={summ['device']} "
          f"dtype={summ['dtype']} kernels={summ['kernels']} timer={summ['timer']}; medians over {rounds} round(s)")
    print(table(settings))
    for s in settings:
        print(strict_json(s))
    print(strict_json(summ), flush=True)
