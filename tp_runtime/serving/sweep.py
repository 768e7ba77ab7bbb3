"""`tp-runtime serve-bench CONFIG [key=value ...]`: a serving benchmark over loads and graph modes.

    tp-runtime serve-bench configs/serve_tiny.yaml                         # CPU, seconds
    tp-runtime serve-bench configs/serve_flash.yaml                        # one H200: 43 Flash layers
    tp-runtime serve-bench configs/serve_tiny.yaml parallel.tp=2 parallel.launcher=ray
    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.serving configs/serve_tiny.yaml

One launch runs `entry.serve_entry` on every rank (in this process at tp = 1, the elastic agent's processes
for tp > 1, Ray actors, or the processes torchrun started: there parallel.tp is WORLD_SIZE). Everything is
checked before any rank starts: the config (config.py), the launch (launcher.check_launchable), each rank's
memory, the output directory. Rank 0's round records become one record per setting (report.py), written to
<serve.output>/<name>/ with the plots; stdout gets the table, a JSON line per setting and the summary last.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from tp_runtime.engine.command import Usage, launch_command, rank_command
from tp_runtime.optional_plots import write_optional_plots
from tp_runtime.parallel.launcher import check_launchable, run_on_ranks
from tp_runtime.paths import check_output_dir
from tp_runtime.serving.config import ServeConfig, check_serve_memory, load_serve
from tp_runtime.serving.entry import serve_entry
from tp_runtime.serving.report import OUTPUT_FILES, print_results, settings_records, summary, write_outputs, \
    write_summary

MODULE = "tp_runtime.serving"  # the torchrun entry: python -m tp_runtime.serving (this module's main)


def out_dir(sc: ServeConfig) -> Path:
    return Path(sc.serve.output) / sc.name


def finish(sc: ServeConfig, config: str, overrides: list[str], rounds: list[dict], wall_s: float) -> int:
    """Write the JSON lines, plots and summary; print the table and the JSON lines. Exit status: 1 when an
    output turned non-finite or a request did not complete, else 0."""
    d = out_dir(sc)
    settings = settings_records(rounds)
    files = write_outputs(d, rounds, settings)
    plot_files, plots = write_optional_plots(bool(sc.serve.plots and settings), "serve.plots",
                                             "tp_runtime.serving.plots", settings, d, sc.name)
    files += plot_files
    summ = summary(sc.name, config, overrides, settings, d, files + ["summary.json"], wall_s)
    summ["plots"] = plots
    write_summary(d, summ)
    print_results(settings, summ)
    problems = [f"{s['mode']} {s['label']}: outputs turned non-finite" for s in settings if not s["outputs_finite"]]
    problems += [f"{s['mode']} {s['label']}: {s['completed']} of {s['requests']} requests completed"
                 for s in settings if s["completed"] != s["requests"]]
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr, flush=True)
        return 1
    return 0


def run_serve_bench(config_path: str, overrides: list[str]) -> int:
    """The `serve-bench` command: 0 on success; 2 on a bad config or a launch refused before any rank started;
    1 when a rank fails or a setting's outputs turned non-finite."""
    return launch_command(lambda: _checked(config_path, overrides),
                          lambda sc: run_on_ranks(sc.worker_config(sc.modes[0]), serve_entry, sc.plan(),
                                                  torchrun_module=MODULE),
                          lambda sc, rounds, wall_s: finish(sc, config_path, overrides, rounds, wall_s))


def _checked(config_path: str, overrides: list[str]) -> ServeConfig:
    sc = load_serve(config_path, overrides)
    check_launchable(sc.worker_config(sc.modes[0]), torchrun_module=MODULE)
    check_serve_memory(sc)
    check_output_dir(out_dir(sc), "serve.output", OUTPUT_FILES)
    return sc


USAGE = ("usage: python -m tp_runtime.parallel.torchrun_main [--standalone | --nnodes N --node-rank K "
         "--rdzv-backend c10d --rdzv-endpoint HOST:PORT] --nproc-per-node P -m tp_runtime.serving "
         "CONFIG [key=value ...]")


@record
def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs the benchmark at tp = WORLD_SIZE; rank 0 writes and prints. SIGINT /
    SIGTERM end a rank at once and without a traceback, as under the run's entry (engine/entry.py)."""
    args = sys.argv[1:] if argv is None else argv
    return rank_command(lambda: _rank_config(args),
                        lambda sc: serve_entry(sc.worker_config(sc.modes[0]).to_dict(), sc.plan()),
                        lambda sc, rounds, wall_s: finish(sc, args[0], args[1:], rounds, wall_s))


def _rank_config(args: list[str]) -> ServeConfig:
    """The benchmark at tp = WORLD_SIZE under torchrun; rank 0 (which writes the results) checks the output
    folder, on its machine."""
    if not args or args[0].startswith("-") or "RANK" not in os.environ:
        raise Usage(USAGE)
    sc = load_serve(args[0], args[1:] + ["parallel.launcher=torchrun", f"parallel.tp={os.environ['WORLD_SIZE']}"])
    check_serve_memory(sc)
    if os.environ["RANK"] == "0":
        check_output_dir(out_dir(sc), "serve.output", OUTPUT_FILES)
    return sc

if __name__ == "__main__":
    sys.exit(main())
