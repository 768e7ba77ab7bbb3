"""SIGINT, SIGTERM and SIGHUP: the one signal path of every command and launcher. The command ends what it
started, says so in one line, `error: interrupted (SIGINT|SIGTERM|SIGHUP)`, and exits 128 + signal.

    exit_while_starting()              # first thing in a command's process, before the slow imports: a
                                       # signal ends it at once with the line (nothing is started yet)
    interruptible(command)             # the launching process (`tp-runtime ...`, the torchrun wrapper):
                                       # a signal raises Interrupted in the main thread, once; the line is
                                       # printed and 128 + n returned (130 / 143 / 129)
    quiet_rank_exit()                  # a rank process: a signal ends it at once, no traceback; it also
                                       # ends when its parent (the launcher, torch's agent) dies

Interrupted derives from KeyboardInterrupt, so no `except Exception` on the way up swallows it and every
`finally` on the way (actors killed, placement group removed, the embedded Ray stopped, the elastic
agent's workers ended) runs. After the first signal further ones are ignored while that clean-up runs
(it is bounded); when the block is left, a late signal ends the process as by default.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it ends


class Interrupted(KeyboardInterrupt):
    """A signal of SIGNALS arrived; the run was stopped. A KeyboardInterrupt, because Ray's blocking calls
    (ray.get, ray.wait) pass on only that from a signal handler, as a KeyboardInterrupt of their own:
    `from_keyboard_interrupt` recovers the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP

    def __str__(self) -> str:
        return f"interrupted ({signal.Signals(self.signum).name})"


_received: list[int] = []  # the signal that raised Interrupted in this process


def from_keyboard_interrupt(e: KeyboardInterrupt) -> Interrupted:
    """The Interrupted behind a KeyboardInterrupt (one that Ray raised anew has lost it): the signal received."""
    if isinstance(e, Interrupted):
        return e
    return Interrupted(_received[0] if _received else signal.SIGINT)


def report(stopped: Interrupted) -> int:
    """The one line on stderr; the exit status."""
    print(f"error: {stopped}", file=sys.stderr, flush=True)
    return stopped.exit_status


def ignore_signals() -> None:
    """Further signals of SIGNALS are ignored (the clean-up after the first one is not cut short)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _raise(signum: int, frame) -> None:
    ignore_signals()
    _received.append(signum)
    raise Interrupted(signum)


def _exit_now(signum: int, frame) -> None:
    os._exit(report(Interrupted(signum)))


def exit_while_starting() -> None:
    """Until `interruptible` takes over, a signal prints the line and ends this process at once: nothing
    has been started yet, and a KeyboardInterrupt inside an import would end it with a traceback."""
    for s in SIGNALS:
        signal.signal(s, _exit_now)


def install() -> None:
    """From now on the signals raise Interrupted in the main thread (while torch's elastic agent runs the
    local ranks, agent_signals.py handles them instead and puts these back afterwards)."""
    for s in SIGNALS:
        signal.signal(s, _raise)


@contextmanager
def on_signals() -> Iterator[None]:
    """Within the block the signals raise Interrupted (once); afterwards they act as by default."""
    install()
    try:
        yield
    finally:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)  # a late Ctrl-C ends the process, no traceback


def interruptible(command: Callable[[], int]) -> int:
    """command() with the signals turned into an interrupt: what it started is ended on the way up, one
    `error:` line names the signal, and the status is 128 + n."""
    with on_signals():
        try:
            return command()
        except KeyboardInterrupt as e:
            return report(from_keyboard_interrupt(e))
        except Exception as e:
            wrapped = _wrapped_interrupt(e)
            if wrapped is None:
                raise
            return report(from_keyboard_interrupt(wrapped))


def _wrapped_interrupt(e: BaseException) -> KeyboardInterrupt | None:
    """The interrupt that Python turned into another exception on its way up, if a signal was received: Python
    3.11 raises RuntimeError("Error calling __set_name__ ...") from an interrupt that lands in a class body's
    __set_name__, as one did inside a lazy `import torch`."""
    if not _received:
        return None
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def die_with_parent() -> None:
    """Linux: this process is SIGKILLed when its parent dies (a launcher or torch's agent killed with
    SIGKILL cannot end its ranks; they would run on, orphaned). A parent already gone ends it now."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl: this process was re-parented already
        os._exit(128 + signal.SIGKILL)


def quiet_rank_exit() -> None:
    """In a rank process (main thread): the signals end it at once, as the kernel's default action does,
    with no traceback, even while it waits inside a collective; and its parent's death ends it too. Its
    launcher is ending the run (it sent the signal, or got it too from the terminal) and reports it; the
    operating system releases what the rank held, and a peer's next collective fails on the closed
    connection."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    die_with_parent()
