"""`tp-runtime bench SWEEP [key=value ...]`: decode-step scaling benchmarks against a roofline.

    tp-runtime bench configs/bench_tiny.yaml                        # CPU smoke sweep (tp 1 and 2)
    tp-runtime bench configs/bench_scaling.yaml                     # H200 grid (needs 4 GPUs for tp = 4)
    tp-runtime bench configs/bench_scaling.yaml grid.parallel.tp=[1,2] bench.repeats=3
    tp-runtime bench configs/bench_scaling.yaml parallel.launcher=ray
    python -m tp_runtime.parallel.torchrun_main --nproc-per-node 2 -m tp_runtime.bench configs/bench_scaling.yaml

One launch per tp value runs `entry.bench_entry` on every rank (in this process for tp = 1, the
elastic agent for tp > 1, Ray actors, or the processes torchrun started). Results go to
<bench.output>/<name>/: points.jsonl, comparisons.jsonl, summary.json and PNG plots; the tables
follow, and the last stdout line is the JSON summary. The folder is locked while the sweep runs, and its
files are written to <name>/unfinished/ and moved up together at the end (results_folder.py), so it never
mixes two runs' files. Rank 0 also appends each point's records to partial.jsonl as it finishes, so a sweep
stopped part-way keeps what it measured in <name>/unfinished/. With grid.shard_of_tp
the one tp = 1 launch runs a group per shard (bench/projection.py): projected points, never mixed with
measured ones (their projected_speedup is filled once every shard has run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path

# No torch here: the sweep's checks, the rank entry and its memory check import it where they run, so a sweep
# refused first (its file, keys, values, launcher) is refused at once.
from tp_runtime.bench.report import OUTPUT_FILES, PLOT_FILES, print_tables, split_records, summary, write_jsonl
from tp_runtime.bench.sweep_config import SweepConfig, load_sweep
from tp_runtime.config import RunConfig
from tp_runtime.engine.command import Usage, launch_command, rank_command
from tp_runtime.optional_plots import write_optional_plots
from tp_runtime.parallel.launcher import check_launchable, run_on_ranks
from tp_runtime.paths import check_output_dir, write_text_atomic
from tp_runtime.results_folder import ResultsFolder, results_path
from tp_runtime.sweep_file import resolve_beside

__all__ = ["launch_plan", "run_bench"]


def _label(variant: tuple) -> str:
    """'base', or e.g. 'v4_pro,num_hidden_layers=8' (a model file by its stem)."""
    words = [Path(v).stem if k == "model_file" else f"{k.removeprefix('model.')}={v}" for k, v in variant]
    return ",".join(words) or "base"


def launch_plan(sweep: SweepConfig) -> list[tuple[RunConfig, dict]]:
    """One (rank config, bench_dict) per tp value: the arguments of `bench_entry` on every rank. With
    grid.shard_of_tp, one group per (variant, shard_of_tp value) in the single tp = 1 launch."""
    variants, modes, s = sweep.variants(), sweep.modes, sweep.bench
    per_tp = sweep.n_points()
    plan = []
    for i, tp in enumerate(sweep.tps):
        groups = []
        for variant in variants:
            baselines = ({m: sweep.worker_config(1, variant, m).to_dict() for m in modes}
                         if tp > 1 and s.compare_tp1 else {})
            group = {"label": _label(variant), "variant": [list(kv) for kv in variant],
                     "batches": list(sweep.grid["bench.batch"]), "contexts": list(sweep.grid["bench.context"]),
                     "workers": {m: sweep.worker_config(tp, variant, m).to_dict() for m in modes},
                     "baselines": baselines}
            if sweep.shard_tps is None:
                groups.append(group)
            else:  # tp = 1 first: the projected speedups divide by it
                groups += [{**group, "shard_of_tp": k, "shard_rank": s.shard_rank} for k in sorted(sweep.shard_tps)]
        bench_dict = {"name": sweep.name, "settings": dataclasses.asdict(s), "groups": groups,
                      "progress": {"offset": i * per_tp, "total": per_tp * len(sweep.tps)}}
        plan.append((sweep.worker_config(tp, variants[0], modes[0]), bench_dict))
    return plan


# ------------------------------------------------------------------ the command


def write_records(staging: Path, records: list[dict]) -> tuple[list[dict], list[dict]]:
    """points.jsonl and comparisons.jsonl of the records so far, in the staging folder (rewritten after every tp
    launch, so a sweep stopped part-way keeps the tp values it finished in <name>/unfinished/)."""
    points, comparisons = split_records(records)
    write_jsonl(staging / "points.jsonl", points)
    write_jsonl(staging / "comparisons.jsonl", comparisons)
    return points, comparisons


def finish(sweep: SweepConfig, results: ResultsFolder, config: str, overrides: list[str], records: list[dict],
           wall_s: float) -> dict:
    """Write JSON lines, summary and plots and publish them; print the tables and the JSON summary (last
    stdout line). Plots that cannot be drawn are warned about and left out; the rest is written."""
    points, comparisons = write_records(results.staging, records)
    plot_files, plots = write_optional_plots(bool(sweep.bench.plots and points), "bench.plots",
                                             "tp_runtime.bench.plots", points, comparisons, results.staging,
                                             files=tuple(results.staging / f for f in PLOT_FILES))
    files = ["points.jsonl", "comparisons.jsonl", "summary.json", *plot_files]
    summ = summary(sweep.name, config, overrides, points, comparisons, results.folder, files, wall_s)
    summ["plots"] = plots
    write_text_atomic(results.staging / "summary.json", json.dumps(summ, indent=2) + "\n")
    results.publish()
    print_tables(points, comparisons)
    print(json.dumps(summ), flush=True)
    return summ


def run_bench(config_path: str, overrides: list[str]) -> int:
    """The `bench` command: 0 on success; 2 on a bad sweep config, an output that would overwrite what the
    sweep reads, a results folder another run is writing, or a launch refused before any rank started (each tp
    value's launch is checked as `run` checks its own; a Ray cluster that can never hold one); 1 when a rank
    fails."""
    with ExitStack() as held:  # the results folder's lock, from the checks to the last write
        return launch_command(lambda: _checked_sweep(config_path, overrides, held), _launch_all,
                              lambda checked, records, wall_s: _finished(checked[0], checked[2], config_path,
                                                                         overrides, records, wall_s))


def sweep_reads(sweep: SweepConfig) -> dict[str, str | None]:
    """What a sweep reads from disk, by the key that names it: its file, its base, model files, checkpoints and
    inputs of every variant."""
    reads: dict[str, str | None] = {"SWEEP": sweep.source, "base": sweep.base_file}
    for name in sweep.grid.get("model_file", []):
        reads[f"grid.model_file {name!r}"] = str(resolve_beside(name, sweep.source))
    for variant in sweep.variants():
        cfg = sweep.worker_config(sweep.tps[0], variant, sweep.modes[0])
        where = _label(variant)
        reads[f"model.checkpoint ({where})"] = cfg.model.checkpoint
        reads[f"workload.inputs ({where})"] = cfg.workload.inputs
    return reads


def _results(sweep: SweepConfig, held: ExitStack) -> ResultsFolder:
    """The sweep's results folder, checked against what the sweep reads, then locked (held until `held` ends)."""
    folder = results_path(sweep.bench.output, sweep.name, "bench.output")
    reads = sweep_reads(sweep)
    check_output_dir(folder, "bench.output", OUTPUT_FILES, keep=reads)
    return held.enter_context(ResultsFolder(folder, OUTPUT_FILES, "bench.output", reads))


def _checked_sweep(config_path: str, overrides: list[str], held: ExitStack
                   ) -> tuple[SweepConfig, list[tuple[RunConfig, dict]], ResultsFolder]:
    sweep = load_sweep(config_path, overrides)
    plan = launch_plan(sweep)
    for cfg, _ in plan:  # the torchrun launcher; fault injection at tp = 1 (grid.parallel.tp)
        check_launchable(cfg, torchrun_module="tp_runtime.bench")
    from tp_runtime.bench.sweep_memory import check_sweep_memory

    check_sweep_memory(sweep)
    return sweep, plan, _results(sweep, held)


def _launch_all(checked: tuple[SweepConfig, list[tuple[RunConfig, dict]], ResultsFolder]) -> list[dict]:
    """One launch per tp value; the records so far written after each."""
    from tp_runtime.bench.entry import bench_entry, partial_log

    sweep, plan, results = checked
    records: list[dict] = []
    write_text_atomic(partial_log(sweep.bench.output, sweep.name), "")  # a fresh, regular log for rank 0 to append to
    for cfg, bench_dict in plan:
        records += run_on_ranks(cfg, bench_entry, bench_dict, torchrun_module="tp_runtime.bench") or []
        write_records(results.staging, records)
    return records


def _finished(sweep: SweepConfig, results: ResultsFolder, config: str, overrides: list[str], records: list[dict],
              wall_s: float) -> int:
    finish(sweep, results, config, overrides, records, wall_s)
    return 0


USAGE = "usage: torchrun --nproc-per-node N -m tp_runtime.bench SWEEP [key=value ...]"


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs the points of tp = WORLD_SIZE; rank 0 writes and prints. As under the
    run's entry (engine/entry.py), SIGINT / SIGTERM end a rank at once and without a traceback; the agent
    (python -m tp_runtime.parallel.torchrun_main: one `error:` line) reports the signal. `record_errors` hands
    a failing rank's traceback to torchrun's summary (parallel/error_file.py)."""
    from tp_runtime.parallel.error_file import record_errors

    return record_errors(_rank_main)(argv)


def _rank_main(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with ExitStack() as held:  # rank 0's lock on the results folder
        return rank_command(lambda: _rank_sweep(args, held), lambda checked: _run_rank(checked[0]),
                            lambda checked, records, wall_s: _finished(checked[0], checked[1], args[0], args[1:],
                                                                       records, wall_s))


def _rank_sweep(args: list[str], held: ExitStack) -> tuple[SweepConfig, ResultsFolder | None]:
    """The sweep at tp = WORLD_SIZE under torchrun; rank 0 (which writes the results) checks the output folder
    and locks it."""
    if not args or "RANK" not in os.environ:
        raise Usage(USAGE)
    world = int(os.environ["WORLD_SIZE"])
    sweep = load_sweep(args[0], args[1:] + ["parallel.launcher=torchrun", f"grid.parallel.tp=[{world}]"])
    from tp_runtime.bench.sweep_memory import check_sweep_memory

    check_sweep_memory(sweep)
    return sweep, _results(sweep, held) if os.environ["RANK"] == "0" else None


def _run_rank(sweep: SweepConfig) -> list[dict] | None:
    from tp_runtime.bench.entry import bench_entry

    (cfg, bench_dict), = launch_plan(sweep)
    return bench_entry(cfg.to_dict(), bench_dict)

if __name__ == "__main__":
    sys.exit(main())
