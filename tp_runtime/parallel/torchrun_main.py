"""torchrun with the project's signal handling: `python -m tp_runtime.parallel.torchrun_main <torchrun args>`.

    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.engine.entry configs/tiny.yaml

The arguments are torchrun's own (torch.distributed.run), unchanged, after
`--signals-to-handle=SIGQUIT` (torch >= 2.9; a later one of the user's wins). SIGINT / SIGTERM / SIGHUP end
the job as under `tp-runtime run`: agent_signals.py raises torch's SignalException, held back while the agent
starts its workers, and the agent ends them; the command prints one `error: interrupted (SIGINT)` line and
exits 128 + n rather than torch's traceback and exit status 1 (interrupt.interruptible, the one signal path).
The ranks end at once and say nothing (interrupt.quiet_rank_exit in each entry), and end too when this
process dies (SIGKILL).
"""

from __future__ import annotations

import sys

from tp_runtime.parallel.interrupt import Interrupted, interruptible

PROG = "python -m tp_runtime.parallel.torchrun_main"


def main(argv: list[str] | None = None) -> int:
    """torch.distributed.run's main on argv (default: this command's arguments); 0, or 128 + signal."""
    args = sys.argv[1:] if argv is None else argv
    sys.argv[0] = PROG  # torchrun's usage line names this command
    return interruptible(lambda: _torchrun(args))  # Interrupted while torch is imported; then agent_signals'


def _torchrun(args: list[str]) -> int:
    """torchrun's main, the signals left to agent_signals; the SignalException (the agent has ended its
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
