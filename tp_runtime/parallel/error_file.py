"""A torchrun rank's error file, written whole or not at all: `record_errors`, torch's `record` with an atomic write.

torch's `record` catches a rank's exception and writes it to TORCHELASTIC_ERROR_FILE (open, then json.dump),
for the elastic agent's failure summary. When one rank fails, the agent SIGTERMs the others and reads their
error files at once. A rank that a signal ends between the open and the dump (a rank's signal handler exits at
once: interrupt.quiet_rank_exit) leaves an empty file, and the agent dies on a JSONDecodeError instead of
reporting the failure. `AtomicErrorHandler` writes the same JSON through paths.atomic_output (a temporary file
beside it, renamed into place: atomic on POSIX): the agent reads no file, or a whole one.
"""

from __future__ import annotations

import json
import time
import traceback
from typing import Callable, TypeVar

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from tp_runtime.paths import atomic_output

R = TypeVar("R")


class AtomicErrorHandler(ErrorHandler):
    """torch's ErrorHandler, whose record_exception writes the error file through paths.atomic_output."""

    def record_exception(self, e: BaseException) -> None:
        """The exception (in an `except` block: its traceback is the one being handled) as torch's handler
        writes it, {"message": {"message": "Type: text", "extraInfo": {"py_callstack", "timestamp"}}}."""
        path = self._get_error_file_path()
        if not path:
            return
        data = {"message": {"message": f"{type(e).__name__}: {e}",
                            "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}
        with atomic_output(path) as tmp, open(tmp, "w") as fp:  # a write cut short leaves no file
            json.dump(data, fp)


def record_errors(fn: Callable[..., R]) -> Callable[..., R | None]:
    """torch's `record` (the rank's traceback into torchrun's summary) with `AtomicErrorHandler`."""
    return record(fn, error_handler=AtomicErrorHandler())
