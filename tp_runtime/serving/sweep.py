"""`tp-runtime serve-bench CONFIG [key=value ...]`: a serving benchmark over loads and graph modes.

    tp-runtime serve-bench configs/serve_tiny.yaml                         # CPU, seconds
    tp-runtime serve-bench configs/serve_flash.yaml                        # one H200: 43 Flash layers
    tp-runtime serve-bench configs/serve_tiny.yaml parallel.tp=2 parallel.launcher=ray
    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.serving configs/serve_tiny.yaml

One launch runs `entry.serve_entry` on every rank (in this process at tp = 1, the elastic agent's processes
for tp > 1, Ray actors, or the processes torchrun started: there parallel.tp is WORLD_SIZE). Everything is
checked before any rank starts: the config (config.py), the launch (launcher.check_launchable), each rank's
memory, the output directory (against what the run reads; then locked). Rank 0's round records become one
record per setting (report.py), written to <serve.output>/<name>/ with the plots (through <name>/unfinished/:
results_folder.py); stdout gets the table, a JSON line per setting and the summary last.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path

from tp_runtime.engine.command import Usage, launch_command, rank_command
from tp_runtime.optional_plots import write_optional_plots
from tp_runtime.parallel.error_file import record_errors
from tp_runtime.parallel.launcher import check_launchable, run_on_ranks
from tp_runtime.paths import check_output_dir, run_reads
from tp_runtime.results_folder import ResultsFolder, results_path
from tp_runtime.serving.config import ServeConfig, check_serve_memory, load_serve
from tp_runtime.serving.entry import serve_entry
from tp_runtime.serving.report import OUTPUT_FILES, PLOT_FILES, print_results, settings_records, summary, \
    write_outputs, write_summary

MODULE = "tp_runtime.serving"  # the torchrun entry: python -m tp_runtime.serving (this module's main)


def out_dir(sc: ServeConfig) -> Path:
    return results_path(sc.serve.output, sc.name, "serve.output")


def finish(sc: ServeConfig, results: ResultsFolder, config: str, overrides: list[str], rounds: list[dict],
           wall_s: float) -> int:
    """Write the JSON lines, plots and summary and publish them; print the table and the JSON lines. Plots that
    cannot be drawn are warned about and left out; the rest is written. Exit status: 1 when an output turned
    non-finite or a request did not complete, else 0."""
    d = results.staging
    settings = settings_records(rounds)
    files = write_outputs(d, rounds, settings)
    plot_files, plots = write_optional_plots(bool(sc.serve.plots and settings), "serve.plots",
                                             "tp_runtime.serving.plots", settings, d, sc.name,
                                             files=tuple(d / f for f in PLOT_FILES))
    files += plot_files
    summ = summary(sc.name, config, overrides, settings, results.folder, files + ["summary.json"], wall_s)
    summ["plots"] = plots
    write_summary(d, summ)
    results.publish()
    print_results(settings, summ)
    problems = [f"{s['mode']} {s['label']}: outputs turned non-finite" for s in settings if not s["outputs_finite"]]
    problems += [f"{s['mode']} {s['label']}: {s['completed']} of {s['requests']} requests completed"
                 for s in settings if s["completed"] != s["requests"]]
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr, flush=True)
        return 1
    return 0


def run_serve_bench(config_path: str, overrides: list[str]) -> int:
    """The `serve-bench` command: 0 on success; 2 on a bad config, an output that would overwrite what the run
    reads, a results folder another run is writing, or a launch refused before any rank started; 1 when a rank
    fails or a setting's outputs turned non-finite."""
    with ExitStack() as held:  # the results folder's lock, from the checks to the last write
        return launch_command(lambda: _checked(config_path, overrides, held),
                              lambda checked: run_on_ranks(checked[0].worker_config(checked[0].modes[0]), serve_entry,
                                                           checked[0].plan(), torchrun_module=MODULE),
                              lambda checked, rounds, wall_s: finish(*checked, config_path, overrides, rounds, wall_s))


def serve_reads(sc: ServeConfig) -> dict[str, str | None]:
    """What serve-bench reads from disk, by the key that names it: its config, the base, the dataset, the
    checkpoint."""
    return {**run_reads(sc.worker_config(sc.modes[0]), "CONFIG"), "CONFIG": sc.source, "base": sc.base_file,
            "serve.dataset": sc.serve.dataset}


def _results(sc: ServeConfig, held: ExitStack) -> ResultsFolder:
    """The results folder, checked against what the run reads, then locked (held until `held` ends)."""
    folder = out_dir(sc)
    reads = serve_reads(sc)
    check_output_dir(folder, "serve.output", OUTPUT_FILES, keep=reads)
    return held.enter_context(ResultsFolder(folder, OUTPUT_FILES, "serve.output", reads))


def _checked(config_path: str, overrides: list[str], held: ExitStack) -> tuple[ServeConfig, ResultsFolder]:
    sc = load_serve(config_path, overrides)
    check_launchable(sc.worker_config(sc.modes[0]), torchrun_module=MODULE)
    check_serve_memory(sc)
    return sc, _results(sc, held)


USAGE = ("usage: python -m tp_runtime.parallel.torchrun_main [--standalone | --nnodes N --node-rank K "
         "--rdzv-backend c10d --rdzv-endpoint HOST:PORT] --nproc-per-node P -m tp_runtime.serving "
         "CONFIG [key=value ...]")


@record_errors
def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs the benchmark at tp = WORLD_SIZE; rank 0 writes and prints. SIGINT /
    SIGTERM end a rank at once and without a traceback, as under the run's entry (engine/entry.py)."""
    args = sys.argv[1:] if argv is None else argv
    with ExitStack() as held:  # rank 0's lock on the results folder
        return rank_command(lambda: _rank_config(args, held),
                            lambda checked: serve_entry(checked[0].worker_config(checked[0].modes[0]).to_dict(),
                                                        checked[0].plan()),
                            lambda checked, rounds, wall_s: finish(*checked, args[0], args[1:], rounds, wall_s))


def _rank_config(args: list[str], held: ExitStack) -> tuple[ServeConfig, ResultsFolder | None]:
    """The benchmark at tp = WORLD_SIZE under torchrun; rank 0 (which writes the results) checks the output
    folder, on its machine, and locks it."""
    if not args or args[0].startswith("-") or "RANK" not in os.environ:
        raise Usage(USAGE)
    sc = load_serve(args[0], args[1:] + ["parallel.launcher=torchrun", f"parallel.tp={os.environ['WORLD_SIZE']}"])
    check_serve_memory(sc)
    return sc, _results(sc, held) if os.environ["RANK"] == "0" else None

if __name__ == "__main__":
    sys.exit(main())
