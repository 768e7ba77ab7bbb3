"""Command line: `tp-runtime run | check | bench | serve-bench CONFIG [key=value ...]`.

    tp-runtime run configs/tiny.yaml                      # the embedded default workload
    tp-runtime run configs/tiny.yaml parallel.tp=4 workload.requests=16
    tp-runtime check configs/tiny.yaml                    # tp / one-shot / oracle comparisons
    tp-runtime write-checkpoint configs/tiny.yaml /tmp/ckpt --files 3   # seeded weights as a DSV4 checkpoint
    tp-runtime run configs/tiny.yaml model.checkpoint=/tmp/ckpt

Each command prints a short summary and, as its last stdout line, one JSON object.
Bad configs and inputs are refused before any rank starts, with the key or tensor named (exit status 2);
a failed rank or run exits 1; SIGINT / SIGTERM / SIGHUP end everything the command started and exit 128 + n.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tp_runtime.parallel.interrupt import exit_while_starting

if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "tp-runtime":  # the command, not an import
    exit_while_starting()  # a signal during the imports below ends it with the one line
# No torch below: it is imported (seconds) where a command first needs it, so a config refused before that point
# is refused at once. From there on a signal raises Interrupted (`interruptible`), imports included.
from tp_runtime.config import ConfigError, RunConfig, check_machine, eager_steps_warning, load_config  # noqa: E402
from tp_runtime.engine.command import interruptible, launch_command
from tp_runtime.engine.input_error import InputError
from tp_runtime.parallel.launcher import check_launchable
from tp_runtime.paths import check_output_dir, check_output_file, run_reads
from tp_runtime.weights.format import INDEX, CheckpointError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tp-runtime", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run the configured workload and report"),
                       ("check", "compare tp, one-shot and oracle outputs; exit 1 on a mismatch"),
                       ("bench", "run a benchmark sweep config (configs/bench_*.yaml)"),
                       ("serve-bench", "serving benchmark: loads x graph modes (configs/serve_*.yaml)")):
        s = sub.add_parser(name, help=text)
        s.add_argument("config", help="YAML config file")
        s.add_argument("overrides", nargs="*", default=[], help="dotted overrides, e.g. parallel.tp=4")
    w = sub.add_parser("write-checkpoint", help="write the config's seeded weights as a DeepSeek-V4 FP8 checkpoint")
    w.add_argument("config", help="YAML config file")
    w.add_argument("out_dir", help="directory to write config.json, the index and the safetensors files to")
    w.add_argument("overrides", nargs="*", default=[], help="dotted overrides, e.g. model.layers=0-7")
    w.add_argument("--files", type=int, default=4, help="number of safetensors files (whole layers each)")
    return p


def _check_startable(cfg: RunConfig, command: str) -> None:
    """Refuse what would start nothing or end at once: a launch this process cannot make (the torchrun launcher,
    fault injection at tp = 1, too few GPUs here: launcher.check_launchable, which `bench` applies to each of its
    launches), zero requests, fault injection under `check` (its tp = 1 comparison runs in this very process)."""
    check_launchable(cfg)
    p, w = cfg.parallel, cfg.workload
    if not w.inputs and w.requests == 0:
        raise ConfigError(f"{cfg.origin('workload.requests')}: 'workload.requests'=0: nothing to run; "
                          "needs at least 1 request")
    if p.fail_rank is not None and command == "check":
        raise ConfigError(f"{cfg.origin('parallel.fail_rank')}: fault injection 'parallel.fail_rank'={p.fail_rank} "
                          "is for `run` and `bench`: `check` also runs tp = 1 in this process")


def _validate_inputs(cfg: RunConfig) -> None:
    """Refuse a bad input file, checkpoint, FP8 shard layout or output path here, before any rank computes."""
    from tp_runtime.engine.workload import read_inputs
    from tp_runtime.memory_fit import check_memory
    from tp_runtime.weights.checkpoint_read import validate_checkpoint
    from tp_runtime.weights.specs import check_fp8_shards

    check_machine(cfg)  # FP8 weights or caches where the ranks would start on this machine's CPU
    if cfg.runtime.weight_format == "fp8":
        try:
            check_fp8_shards(cfg.model, cfg.parallel.tp)
        except ValueError as e:
            raise ConfigError(f"{cfg.source}: {e}") from None
    if cfg.workload.inputs:
        read_inputs(cfg.workload.inputs, cfg.model.hidden_size)
    if cfg.model.checkpoint:
        validate_checkpoint(cfg.model, cfg.model.checkpoint)
    if cfg.workload.dump:  # on this machine; rank 0 writes it (elsewhere only under a multi-node Ray)
        check_output_file(cfg.workload.dump, "workload.dump", keep=run_reads(cfg))
    check_memory(cfg)  # each rank's weights, caches and workspace against its device's memory


def _check_run(args: argparse.Namespace) -> RunConfig:
    """`run` / `check`'s config, refused here (with the key or tensor named) unless it can start and run."""
    cfg = load_config(args.config, args.overrides)
    _check_startable(cfg, args.command)
    _validate_inputs(cfg)
    if note := eager_steps_warning(cfg):  # steps larger than every breakable graph: correct, but eager
        print(f"warning: {note}", file=sys.stderr, flush=True)
    return cfg


SLOW_CPU_BUILD_BYTES = 2**30  # weights per rank above which a CPU build takes long enough to say so first


def _say_slow_cpu_build(cfg: RunConfig) -> None:
    """One progress line on stderr before a large model is built on a CPU (v4_flash: minutes of silence else)."""
    from tp_runtime.memory_fit import device_type, size
    from tp_runtime.memory_model import rank_memory

    weights = rank_memory(cfg, "cpu")["weights"] if device_type(cfg) == "cpu" else 0
    if weights > SLOW_CPU_BUILD_BYTES:
        print(f"tp_runtime: building {len(cfg.model.layer_ids())} layers ({size(weights)} of weights per rank, "
              f"parallel.tp={cfg.parallel.tp}) on the CPU: slow, minutes before the first step", file=sys.stderr,
              flush=True)


def _launch_run(cfg: RunConfig):
    from tp_runtime.engine.entry import launch

    _say_slow_cpu_build(cfg)
    return launch(cfg)


def _finish_run(cfg: RunConfig, result, wall_s: float) -> int:
    from tp_runtime.engine.report import report_and_status

    return report_and_status(cfg, result)


def _launch_check(cfg: RunConfig) -> dict:
    from tp_runtime.verify.check import run_check

    return run_check(cfg)


def _finish_check(cfg: RunConfig, rec: dict, wall_s: float) -> int:
    from tp_runtime.engine.report import strict_json

    print(f"tp_runtime check: tp={rec['tp']} device={rec['device']} dtype={rec['dtype']} "
          f"graphs={rec['graph_mode']} requests={rec['requests']}")
    for name, c in rec["comparisons"].items():
        err = f"{c['max_rel_err']:.3e}" if c["max_rel_err"] is not None else f"non-finite ({c['nonfinite']})"
        print(f"  {name:24s} max_rel_err {err}  tol {c['tol']:.0e}  {'ok' if c['ok'] else 'FAIL'}")
    if not rec["requests"]:
        print("  no request completed: nothing was compared")
    print(strict_json(rec), flush=True)
    return 0 if rec["ok"] else 1


def _cmd_write_checkpoint(cfg: RunConfig, out_dir: str, n_files: int) -> int:
    from tp_runtime.weights.checkpoint_write import write_checkpoint

    # never the folder, or a folder inside what the run reads (the config, a checkpoint the config names)
    check_output_dir(out_dir, "write-checkpoint OUT_DIR", files=(INDEX, "config.json"), keep=run_reads(cfg))
    rec = write_checkpoint(cfg, out_dir, n_files)
    for note in rec["notes"]:  # what an earlier, interrupted write left, and what became of it
        print(f"warning: {note}", file=sys.stderr)
    print(f"tp_runtime write-checkpoint: {rec['layers']} layers, {rec['tensors']} tensors, "
          f"{rec['bytes'] / 2**20:.1f} MiB in {rec['files']} files under {rec['directory']}")
    print(json.dumps({"command": "write-checkpoint", **rec}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)  # write-checkpoint: overrides may follow --files
    if extra and (args.command != "write-checkpoint" or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides += extra
    return interruptible(lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "bench":
            from tp_runtime.bench.sweep import run_bench

            return run_bench(args.config, args.overrides)
        if args.command == "serve-bench":
            from tp_runtime.serving.sweep import run_serve_bench

            return run_serve_bench(args.config, args.overrides)
        if args.command == "write-checkpoint":
            return _cmd_write_checkpoint(load_config(args.config, args.overrides), args.out_dir, args.files)
    except (ConfigError, InputError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    launch, finish = (_launch_run, _finish_run) if args.command == "run" else (_launch_check, _finish_check)
    # a rank that found its weights bad while loading failed (1); a bad input before any rank started is refused (2)
    return launch_command(lambda: _check_run(args), launch, finish, refusals=(InputError, CheckpointError),
                          failures=(CheckpointError,))


if __name__ == "__main__":
    sys.exit(main())
