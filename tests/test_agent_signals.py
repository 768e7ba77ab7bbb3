"""agent_signals: a SIGTERM that lands while the agent starts its ranks is held back until the start has
returned, then raised once as torch's SignalException; the previous handlers come back afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException

from tp_runtime.parallel.agent_signals import agent_signals


def _start_that_gets_signalled() -> str:
    """Stands for the agent's worker start: the signal arrives while it runs, and again (re-sent) during it."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # several re-sends (every 50 ms) land in here and are held back too
    return "started"


def test_a_signal_during_the_start_is_raised_after_it() -> None:
    before = signal.getsignal(signal.SIGTERM)
    returned = []
    with pytest.raises(SignalException) as e:
        with agent_signals(starting=(_start_that_gets_signalled,)):
            returned.append(_start_that_gets_signalled())  # not cut short
            time.sleep(2)  # the held-back signal is raised here
    assert returned == ["started"]
    assert e.value.sigval == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_outside_the_start_is_raised_at_once_and_only_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(SignalException):
        with agent_signals(starting=(_start_that_gets_signalled,)):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
    assert time.monotonic() - t0 < 1.0
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # the previous handler is back


def test_the_agent_is_told_to_leave_sigint_and_sigterm_alone() -> None:
    from torch.distributed.launcher.api import LaunchConfig

    from tp_runtime.parallel.agent_signals import agent_handles

    kw = agent_handles()  # this torch (>= 2.9) has the field; an older one gets {} and its own handlers
    assert kw == {"signals_to_handle": "SIGQUIT"}
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, **kw).signals_to_handle == "SIGQUIT"
