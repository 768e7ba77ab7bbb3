"""A rank's heartbeat for the length of its work (`run` and `bench` alike): a peer that stopped answering is
named, and ended where it runs on this machine, instead of leaving the run to hang.

    with PeerWatch(tp, timeout_s) as watch:   # beats once the process group exists (tp > 1)
        worker = ...
        if worker.tp.allreduce.uses_symm:     # collectives with no timeout of their own
            watch.arm()
        ...

On leaving the block: normally, the heartbeat finishes (rank 0 may still write the results, so this rank's
silence is no loss); on an exception, a silent peer turns it into RankLostError naming that peer. Armed
(symmetric-memory all-reduce, whose kernels spin on the device until every peer arrives), the heartbeat
thread acts on its own: a peer silent for timeout_s ends this process within timeout_s + one period,
even while its main thread is blocked on the device.
"""

from __future__ import annotations

import os
import sys

from tp_runtime.parallel.errors import RankLostError
from tp_runtime.parallel.group import TPGroup
from tp_runtime.parallel.heartbeat import Heartbeat, Silent, kill, lost_message, on_this_machine


class PeerWatch:
    """Context manager: the heartbeat of rank tp.rank among tp.size (none at tp = 1)."""

    def __init__(self, tp: TPGroup, timeout_s: float) -> None:
        self.rank, self.timeout_s = tp.rank, timeout_s
        self.beat = Heartbeat.start(tp.rank, tp.size, timeout_s) if tp.size > 1 else None
        self.armed = False

    def arm(self) -> None:
        """From now on, a peer silent for timeout_s ends this process from the heartbeat thread."""
        if self.beat is not None and not self.armed:
            self.beat.watch(self.timeout_s, self._exit_lost)
            self.armed = True

    def __enter__(self) -> "PeerWatch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.beat is None:
            return
        try:
            if exc is None:
                self.beat.finish()
            elif isinstance(exc, Exception) and (lost := self.beat.silent_peers()):
                raise self._peers_lost(lost) from exc
        finally:
            self.beat.stop()

    def _peers_lost(self, lost: list[Silent]) -> RankLostError:
        """Name the silent peers (stderr, the launcher's store, the error) and end those on this machine."""
        here = on_this_machine(lost)
        message = lost_message(lost, here, self.rank, self.timeout_s)
        # Said before the kill: a launcher may stop this rank as soon as it sees the killed one.
        print(f"tp_runtime: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        self.beat.record_lost(message)  # the local launcher reads it from its store
        kill(here)
        return RankLostError(message)

    def _exit_lost(self, lost: list[Silent]) -> None:
        """The armed watch's action: name and end the silent peers, then end this process, whose main
        thread may be blocked on a kernel that waits for them forever."""
        self._peers_lost(lost)
        os._exit(1)
