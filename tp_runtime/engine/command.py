"""The shell of the commands that launch ranks (`run`, `check`, `serve-bench`, `bench`) and of their torchrun
entries: checks before any rank starts, the launch, what is made of the result, and the exit status.

    0          success (or what `finish` returns: serve-bench's 1 for a non-finite output or unfinished request)
    1          a rank failed (LaunchError, or the command's own `failures`)
    2          refused before any rank started: a bad config or input (ConfigError, the command's own
               `refusals`), a usage error, or a launch the cluster can never hold (LaunchRefused)
    128 + n    SIGINT / SIGTERM / SIGHUP (130 / 143 / 129): everything the command started was ended, one
               `error: interrupted (SIG...)` line (`interruptible`, parallel/interrupt.py)

Each refusal or failure is one `error: ...` line on stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from tp_runtime.config import ConfigError
from tp_runtime.parallel.errors import LaunchError, LaunchRefused
from tp_runtime.parallel import interrupt
from tp_runtime.parallel.interrupt import quiet_rank_exit

Checked = TypeVar("Checked")
Result = TypeVar("Result")


class Usage(Exception):
    """A torchrun entry called without what it needs: its usage line, printed as it is (exit status 2)."""


def _error(e: BaseException, status: int) -> int:
    print(f"error: {e}", file=sys.stderr)
    return status


def launch_command(check: Callable[[], Checked], launch: Callable[[Checked], Result],
                   finish: Callable[[Checked, Result, float], int], refusals: tuple[type[Exception], ...] = (),
                   failures: tuple[type[Exception], ...] = ()) -> int:
    """check() (refused: 2), launch its result on the ranks (refused: 2; a rank failed: 1), then finish(checked,
    result, seconds the launch took) gives the status."""
    try:
        checked = check()
    except (ConfigError, *refusals) as e:
        return _error(e, 2)
    t0 = time.perf_counter()
    try:
        result = launch(checked)
    except LaunchRefused as e:  # nothing was placed (the cluster can never hold it)
        return _error(e, 2)
    except (LaunchError, *failures) as e:
        return _error(e, 1)
    return finish(checked, result, time.perf_counter() - t0)


def rank_command(check: Callable[[], Checked], run: Callable[[Checked], Result | None],
                 finish: Callable[[Checked, Result, float], int]) -> int:
    """A torchrun entry on one rank: a signal, or its agent's death, ends it at once and quietly; check() (a
    usage error or a refusal: 2); this rank's part; rank 0 (the one with a result) finishes, the others exit 0.
    A rank that fails raises (status 1; torchrun's summary shows the traceback)."""
    quiet_rank_exit()
    try:
        checked = check()
    except Usage as e:
        print(e, file=sys.stderr)
        return 2
    except ConfigError as e:
        return _error(e, 2)
    t0 = time.perf_counter()
    result = run(checked)
    return finish(checked, result, time.perf_counter() - t0) if result is not None else 0


def interruptible(command: Callable[[], int]) -> int:
    """command() with SIGINT / SIGTERM / SIGHUP turned into an interrupt: what it started is ended on the way
    up, one `error:` line names the signal, and the status is 128 + n (the one signal path: interrupt.py)."""
    return interrupt.interruptible(command)
