"""The per-rank entry every launcher runs, and the torchrun entry point.

    worker_entry(cfg_dict)   join the TP group, build a Worker, drive the workload (every rank)
    launch(cfg)              worker_entry on every rank under cfg.parallel.launcher; rank 0's result

Under torchrun this module is the entry point (one machine, or one command per machine with
--nnodes / --node-rank / a c10d rendezvous endpoint):

    torchrun --nproc-per-node 2 -m tp_runtime.engine.entry configs/tiny.yaml
    torchrun --nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HEAD:29400 \
        --nproc-per-node 1 -m tp_runtime.engine.entry configs/tiny.yaml
"""

from __future__ import annotations

import os
import sys

from tp_runtime.config import ConfigError, RunConfig, config_from_dict, eager_steps_warning, load_config
from tp_runtime.engine.command import rank_command
from tp_runtime.engine.driver import RunResult, drive
from tp_runtime.engine.report import report_and_status
from tp_runtime.engine.session import RankSession
from tp_runtime.parallel.error_file import record_errors
from tp_runtime.parallel.launcher import run_on_ranks
from tp_runtime.paths import check_output_file, run_reads


def worker_entry(cfg_dict: dict, oneshot: bool = False, keep_outputs: bool = False):
    """What every launcher runs on each rank: join the group, build a Worker, drive the workload (session.py).

    Returns the driver's result on rank 0 and None elsewhere. When a collective fails because a peer
    stopped answering (its heartbeat stopped), the error names that peer; one on this machine is
    killed first, so that the launcher does not wait on a process that cannot act on SIGTERM. Where the
    all-reduce runs in symmetric memory (no collective timeout), the heartbeat watches on its own: a peer
    silent for parallel.timeout_s ends this rank the same way, even while it is blocked on the device.
    """
    cfg = config_from_dict(cfg_dict)
    with RankSession(cfg) as session:
        worker = session.worker(cfg, oneshot=oneshot)
        return drive(worker, oneshot=oneshot, keep_outputs=keep_outputs)


def launch(cfg: RunConfig, oneshot: bool = False, keep_outputs: bool = False) -> RunResult:
    """Run the workload on every rank under cfg.parallel.launcher; rank 0's result."""
    return run_on_ranks(cfg, worker_entry, oneshot, keep_outputs)


def in_process(cfg: RunConfig, oneshot: bool = False, keep_outputs: bool = False) -> RunResult:
    """tp = 1 in this very process (no process group)."""
    return worker_entry(cfg.to_dict(), oneshot=oneshot, keep_outputs=keep_outputs)


USAGE = "usage: torchrun [--nnodes N --node-rank K --rdzv-backend c10d --rdzv-endpoint HOST:PORT] " \
        "--nproc-per-node P -m tp_runtime.engine.entry CONFIG [key=value ...]"


def _torchrun_config(args: list[str]) -> RunConfig:
    """The run's config, checked against the processes torchrun started (WORLD_SIZE must equal tp)."""
    if not args or args[0].startswith("-"):
        raise ConfigError(USAGE)
    cfg = load_config(args[0], args[1:] + ["parallel.launcher=torchrun"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != cfg.parallel.tp:
        raise ConfigError(f"torchrun started {world} processes (nnodes x nproc-per-node) but "
                          f"parallel.tp={cfg.parallel.tp}; they must be equal")
    if cfg.workload.dump and os.environ.get("RANK") == "0":  # rank 0 writes it, on its machine
        check_output_file(cfg.workload.dump, "workload.dump", keep=run_reads(cfg))
    return cfg


@record_errors
def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs the worker; rank 0 prints the report and the JSON line.

    A failing rank raises (exit status 1; `record_errors` hands the traceback to torchrun's summary); the
    others then fail in their next collective (a closed connection at once, a hung peer after
    parallel.timeout_s), and torchrun stops the rest, so every rank exits non-zero in bounded time.
    SIGINT / SIGTERM (a Ctrl-C reaches the agent and every rank; the agent passes its own on) end a rank
    at once and without a traceback; torchrun's agent reports the signal.
    """
    return rank_command(lambda: _rank_config(sys.argv[1:] if argv is None else argv),
                        lambda cfg: worker_entry(cfg.to_dict()), lambda cfg, result, _: report_and_status(cfg, result))


def _rank_config(args: list[str]) -> RunConfig:
    cfg = _torchrun_config(args)
    if os.environ.get("RANK") == "0" and (note := eager_steps_warning(cfg)):
        print(f"warning: {note}", file=sys.stderr, flush=True)
    return cfg

if __name__ == "__main__":
    sys.exit(main())
