"""SIGINT and SIGTERM: the command ends what it started, says so in one line, and exits 128 + signal.

    with on_signals():                 # the launching process (`tp-runtime run | check | bench`)
        ...                            # a signal raises Interrupted in the main thread, once
    except KeyboardInterrupt as e:     # from_keyboard_interrupt(e): "error: interrupted (SIGINT)", exit
                                       # status 130 (SIGINT) / 143 (SIGTERM)

    quiet_rank_exit()                  # a rank process: a signal ends it at once, no traceback; its
                                       # launcher reports it

Interrupted derives from KeyboardInterrupt, so no `except Exception` on the way up swallows it and every
`finally` on the way (actors killed, placement group removed, the embedded Ray stopped, the elastic
agent's workers ended) runs. After the first signal further SIGINT / SIGTERM are ignored while that
clean-up runs (it is bounded); when the block is left, a late signal ends the process as by default.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; the run was stopped. A KeyboardInterrupt, because Ray's blocking calls
    (ray.get, ray.wait) pass on only that from a signal handler, as a KeyboardInterrupt of their own:
    `from_keyboard_interrupt` recovers the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM

    def __str__(self) -> str:
        return f"interrupted ({signal.Signals(self.signum).name})"


_received: list[int] = []  # the signal that raised Interrupted in this process


def from_keyboard_interrupt(e: KeyboardInterrupt) -> Interrupted:
    """The Interrupted behind a KeyboardInterrupt (one that Ray raised anew has lost it): the signal received."""
    if isinstance(e, Interrupted):
        return e
    return Interrupted(_received[0] if _received else signal.SIGINT)


def _raise(signum: int, frame) -> None:
    for s in SIGNALS:  # one report; the clean-up that follows is not interrupted again
        signal.signal(s, signal.SIG_IGN)
    _received.append(signum)
    raise Interrupted(signum)


def install() -> None:
    """From now on SIGINT / SIGTERM raise Interrupted in the main thread (while torch's elastic agent runs
    the local ranks, agent_signals.py handles them instead and puts these back afterwards)."""
    for s in SIGNALS:
        signal.signal(s, _raise)


@contextmanager
def on_signals() -> Iterator[None]:
    """Within the block, SIGINT / SIGTERM raise Interrupted (once); afterwards they act as by default."""
    install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a late Ctrl-C ends the process, no traceback
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def quiet_rank_exit() -> None:
    """In a rank process (main thread): SIGINT / SIGTERM end it at once, as the kernel's default action
    does, with no traceback, even while it waits inside a collective. Its launcher is ending the run (it
    sent the signal, or got it too from the terminal's Ctrl-C) and reports it; the operating system
    releases what the rank held, and a peer's next collective fails on the closed connection."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
