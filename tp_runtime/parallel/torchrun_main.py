"""torchrun with the project's signal handling: `python -m tp_runtime.parallel.torchrun_main <torchrun args>`.

    python -m tp_runtime.parallel.torchrun_main --standalone --nproc-per-node 2 \
        -m tp_runtime.engine.entry configs/tiny.yaml

The arguments are torchrun's own (torch.distributed.run), unchanged, after
`--signals-to-handle=SIGQUIT` (torch >= 2.9; a later one of the user's wins). SIGINT / SIGTERM / SIGHUP end
the job as under `tp-runtime run`: agent_signals.py raises torch's SignalException, held back while the agent
starts its workers, and the agent ends them; the command prints one `error: interrupted (SIGINT)` line and
exits 128 + n rather than torch's traceback and exit status 1 (interrupt.interruptible, the one signal path).
The ranks end at once and say nothing (interrupt.quiet_rank_exit in each entry), and end too when this
process dies (SIGKILL). Before torchrun starts anything, a process count below 1 and a missing or unreadable
config file of one of the project's entries are refused in one `error:` line (exit 2): otherwise every rank
would fail on its own, or torchrun would end in a traceback.
"""

from __future__ import annotations

import sys

from tp_runtime.config_yaml import ConfigError, read_text
from tp_runtime.parallel.interrupt import Interrupted, interruptible

PROG = "python -m tp_runtime.parallel.torchrun_main"
NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def main(argv: list[str] | None = None) -> int:
    """torch.distributed.run's main on argv (default: this command's arguments); 0, 2 for arguments refused
    before any rank starts (one `error:` line), or 128 + signal."""
    args = sys.argv[1:] if argv is None else argv
    sys.argv[0] = PROG  # torchrun's usage line names this command
    try:
        check_args(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return interruptible(lambda: _torchrun(args))  # Interrupted while torch is imported; then agent_signals'


def check_args(args: list[str]) -> None:
    """ConfigError, before torchrun starts any rank, for what every rank would fail on or torchrun would answer
    with a traceback: a number of processes per node below 1, and the config file of one of this project's
    entries (`-m tp_runtime.... CONFIG`) missing or not a regular text file."""
    head = args[:args.index("-m")] if "-m" in args else args  # torchrun's own arguments, before the module's
    value = _arg(head, *NPROC_FLAGS) or ""
    if value.lstrip("-").isdigit() and int(value) < 1:
        raise ConfigError(f"--nproc-per-node {value}: torchrun needs at least 1 process per node")
    if "-m" in args:
        i = args.index("-m")
        entry, rest = (args[i + 1], args[i + 2:]) if i + 1 < len(args) else ("", [])
        config = next((r for r in rest if not r.startswith("-") and "=" not in r), None)
        if entry.startswith("tp_runtime.") and config is not None:
            read_text(config, "config")


def _torchrun(args: list[str]) -> int:
    """torchrun's main, the signals left to agent_signals; the SignalException (the agent has ended its
    workers) as Interrupted."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    from tp_runtime.parallel.agent_signals import agent_handles, agent_signals

    ours = [f"--signals-to-handle={v}" for v in agent_handles().values()]  # torchrun's flag for the field
    try:
        with agent_signals():
            torchrun.main([*ours, *args])
    except SignalException as e:
        raise Interrupted(e.sigval) from None
    except (RendezvousTimeoutError, RendezvousConnectionError) as e:
        what = "did not complete within its join_timeout" if isinstance(e, RendezvousTimeoutError) else \
            "could not be reached"
        print(f"error: the rendezvous at {_arg(args, '--rdzv-endpoint', '--rdzv_endpoint') or 'its endpoint'} {what} "
              f"(--rdzv-conf join_timeout=S sets the wait; torchrun's default is 600 s)", file=sys.stderr)
        return 1
    return 0


def _arg(args: list[str], *flags: str) -> str | None:
    """The value of the first of `flags` in torchrun's arguments (`--flag value` or `--flag=value`), else None."""
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in flags:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


if __name__ == "__main__":
    sys.exit(main())
