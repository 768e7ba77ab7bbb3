"""torchrun with the project's signal handling: `python -m tp_runtime.parallel.torchrun_main <torchrun args>`.

    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.engine.entry configs/tiny.yaml

The arguments are torchrun's own (torch.distributed.run), unchanged, after
`--signals-to-handle=SIGHUP,SIGQUIT` (torch >= 2.9; a later one of the user's wins). SIGINT / SIGTERM end the
job as under `tp-runtime run`: agent_signals.py raises torch's SignalException, held back while the agent
starts its workers, and the agent ends them; the command prints one `error: interrupted (SIGINT)` line and
exits 130 (143 for SIGTERM) rather than torch's traceback and exit status 1. The ranks end at once and say
nothing (interrupt.quiet_rank_exit in each entry).
"""

from __future__ import annotations

import sys

from tp_runtime.parallel.interrupt import Interrupted, from_keyboard_interrupt, on_signals

PROG = "python -m tp_runtime.parallel.torchrun_main"


def main(argv: list[str] | None = None) -> int:
    """torch.distributed.run's main on argv (default: this command's arguments); 0, or 128 + signal."""
    args = sys.argv[1:] if argv is None else argv
    sys.argv[0] = PROG  # torchrun's usage line names this command
    with on_signals():  # Interrupted while torch is imported; then agent_signals' handler (_torchrun)
        try:
            _torchrun(args)
        except KeyboardInterrupt as e:
            stopped = from_keyboard_interrupt(e)
            print(f"error: {stopped}", file=sys.stderr, flush=True)
            return stopped.exit_status
    return 0


def _torchrun(args: list[str]) -> None:
    """torchrun's main, SIGINT / SIGTERM left to agent_signals; the SignalException (the agent has ended its
    workers) as Interrupted."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from tp_runtime.parallel.agent_signals import agent_handles, agent_signals

    ours = [f"--signals-to-handle={v}" for v in agent_handles().values()]  # torchrun's flag for the field
    try:
        with agent_signals():
            torchrun.main([*ours, *args])
    except SignalException as e:
        raise Interrupted(e.sigval) from None


if __name__ == "__main__":
    sys.exit(main())
