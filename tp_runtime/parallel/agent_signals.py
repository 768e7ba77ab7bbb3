"""SIGINT / SIGTERM / SIGHUP while torch's elastic agent runs the local ranks: held back while it starts them.

torch's agent installs a handler that raises SignalException wherever the main thread is. Raised while
multiprocessing writes a new rank's start-up data into its pipe, that rank reads a cut pickle (EOFError),
or a semaphore its launcher has already unlinked (FileNotFoundError): a traceback after the run's
`error:` line, from a rank the agent never learned of and so does not end.

Within `agent_signals()` the agent leaves them (interrupt.SIGNALS) to this module (its LaunchConfig's
signals_to_handle is AGENT_HANDLES, torch >= 2.9; `agent_handles()`). The handler raises the same
SignalException, so the agent ends its workers as before, except while the agent is starting them: then the
signal is sent again RETRY_S later, until every rank has started and is known to the agent.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import threading
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Callable, Iterator

from tp_runtime.parallel.interrupt import SIGNALS

RETRY_S = 0.05  # how soon a held-back signal is sent again (starting two ranks takes ~0.1 s)
AGENT_HANDLES = "SIGQUIT"  # LaunchConfig.signals_to_handle: what torch's agent still handles itself


def agent_handles() -> dict[str, str]:
    """LaunchConfig keywords that leave SIGINT / SIGTERM / SIGHUP to this module: {} where torch's LaunchConfig
    has no signals_to_handle (before torch 2.9); there the agent handles them itself, as it always did."""
    from torch.distributed.launcher.api import LaunchConfig

    has = "signals_to_handle" in {f.name for f in dataclasses.fields(LaunchConfig)}
    return {"signals_to_handle": AGENT_HANDLES} if has else {}


def agent_start() -> tuple[Callable, ...]:
    """The agent's worker start (it records the started processes as it returns) and torch's process
    start under it."""
    import torch.multiprocessing
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    fns = [torch.multiprocessing.start_processes, getattr(LocalElasticAgent, "_start_workers", None)]
    return tuple(f for f in fns if f is not None)


def _on_stack(frame: FrameType | None, codes: set[CodeType]) -> bool:
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


@contextmanager
def agent_signals(starting: tuple[Callable, ...] | None = None) -> Iterator[None]:
    """Within the block SIGINT / SIGTERM / SIGHUP raise torch's SignalException in the main thread, once, and
    not while one of the `starting` functions (default: agent_start()) runs; the previous handlers come back
    afterwards. The agent's LaunchConfig must have agent_handles()."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    codes = {inspect.unwrap(f).__code__ for f in (agent_start() if starting is None else starting)}
    pending: list[threading.Timer] = []  # re-sends not yet made; cancelled when the block is left

    def handler(signum: int, frame: FrameType | None) -> None:
        if _on_stack(frame, codes):
            again = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
            again.daemon = True
            pending.append(again)
            again.start()
            return
        for s in SIGNALS:  # one report; the agent's shutdown of its workers is not cut short
            signal.signal(s, signal.SIG_IGN)
        sig = signal.Signals(signum)
        raise SignalException(f"process {os.getpid()} got {sig.name}", sigval=sig)

    saved = [signal.getsignal(s) for s in SIGNALS]
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for t in pending:
            t.cancel()
        for s, h in zip(SIGNALS, saved):
            signal.signal(s, h)
