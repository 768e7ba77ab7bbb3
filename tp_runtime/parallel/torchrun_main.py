"""torchrun with the project's signal handling: `python -m tp_runtime.parallel.torchrun_main <torchrun args>`.

    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.engine.entry configs/tiny.yaml

The arguments are torchrun's own (torch.distributed.run), unchanged. SIGINT / SIGTERM end the job as under
`tp-runtime run`: the elastic agent ends its workers (its handler raises torch's SignalException once they
run; before that, the project's Interrupted), and the command prints one `error: interrupted (SIGINT)` line
and exits 130 (143 for SIGTERM) rather than torch's traceback and exit status 1. The ranks end at once and
say nothing (interrupt.quiet_rank_exit in each entry).
"""

from __future__ import annotations

import sys

from tp_runtime.parallel.interrupt import Interrupted, from_keyboard_interrupt, on_signals

PROG = "python -m tp_runtime.parallel.torchrun_main"


def main(argv: list[str] | None = None) -> int:
    """torch.distributed.run's main on argv (default: this command's arguments); 0, or 128 + signal."""
    args = sys.argv[1:] if argv is None else argv
    sys.argv[0] = PROG  # torchrun's usage line names this command
    with on_signals():  # Interrupted (torch's import included) until the agent starts its workers; then the
        try:            # agent's own handlers, until it returns or has ended its workers on a signal
            _torchrun(args)
        except KeyboardInterrupt as e:
            stopped = from_keyboard_interrupt(e)
            print(f"error: {stopped}", file=sys.stderr, flush=True)
            return stopped.exit_status
    return 0


def _torchrun(args: list[str]) -> None:
    """torchrun's main; the agent's SignalException (its workers ended) as Interrupted."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        torchrun.main(args)
    except SignalException as e:
        raise Interrupted(e.sigval) from None


if __name__ == "__main__":
    sys.exit(main())
