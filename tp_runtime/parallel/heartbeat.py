"""Heartbeats: each rank tells the rendezvous store once a second that it is alive, so that when a
collective fails the rank that stopped answering can be named (and, on this machine, ended).

    beat = Heartbeat.start(tp.rank, tp.size, timeout_s)   # once the process group exists
    ...                                                   # a collective raised:
    lost = beat.silent_peers()                            # [Silent(rank, age_s, host, pid)]
    here = on_this_machine(lost)
    beat.record_lost(lost_message(lost, here, rank, timeout_s))   # for a launcher that reads the store
    kill(here)
    beat.stop()

A daemon thread adds 1 to this rank's counter every `period_s` and reads every peer's counter. A peer
whose counter has not moved for 3 periods while this rank's own store calls went through is silent:
stopped (SIGSTOP, a debugger), stuck in the kernel, or its machine gone. A slow but live rank keeps
beating (the thread runs beside compute and collectives, which release the GIL); a rank that died
stops beating too, but its peers' collectives then fail at once on the closed connection, long before
it counts as silent. When this rank's own store calls stall, the silent one is the store's host: rank
0 when the ranks host their store (Ray, plain env:// init), the launcher when it does (torchrun, the
local launcher: TORCHELASTIC_USE_AGENT_STORE).

Where no collective timeout applies (the symmetric-memory all-reduce: its kernels spin on the device until
every peer arrives, parallel/allreduce.py), `watch(timeout_s, on_lost)` makes the thread act on its own: once
a peer has been silent for timeout_s, on_lost(lost) runs on the thread (entry.py names the peer, ends it when
on this machine, and exits), so a rank blocked on the device still ends within timeout_s + one period.

Why end a silent peer: the run has failed already, and a stopped process cannot act on SIGTERM, so
torch's elastic agent (torchrun, the local launcher) would wait its termination grace before its
SIGKILL, a fixed 30 s on the failure path (LocalElasticAgent._stop_workers calls _shutdown() with its
default; --shutdown-timeout and TORCH_ELASTIC_SHUTDOWN_TIMEOUT apply only to the signal and exit paths).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

SILENT_PERIODS = 3  # periods without a moving counter that make a peer silent
PREFIX = "tp_runtime/heartbeat"  # this module's keys in the launcher's store
WHO_WAIT_S = 10.0  # at start, how long a rank waits for its peers' identities before beating without them


@dataclass(frozen=True)
class Silent:
    """A rank whose heartbeat stopped: which one, for how long, and where it runs (if it said)."""

    rank: int | None  # None: the launcher's store, not a rank
    age_s: float
    host: str = "?"
    pid: int = 0
    pidns: str = ""

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the launcher's rendezvous store"
        return f"{who} (host {self.host}, pid {self.pid})" if self.pid else who


def _identity() -> dict:
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pidns": pidns}


class Heartbeat:
    def __init__(self, store: dist.Store, rank: int, world: int, period_s: float, store_rank: int | None):
        self.rank, self.period_s, self.store_rank = rank, period_s, store_rank
        self.peers = [r for r in range(world) if r != rank]
        self._store, self._lock, self._stop = store, threading.Lock(), threading.Event()
        now = time.monotonic()
        self._last_ok, self._moved = now, dict.fromkeys(self.peers, now)
        self._count: dict[int, int] = {}
        self._who: dict[int, dict] = {}
        self._watch: tuple[float, Callable[[list[Silent]], None]] | None = None
        store.set(f"who/{rank}", json.dumps(_identity()))
        self._thread = threading.Thread(target=self._loop, name="tp-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, rank: int, world: int, timeout_s: float) -> Heartbeat:
        """Beat through the launcher's store (MASTER_ADDR:MASTER_PORT), as a client of its own."""
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        store_rank = None if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else 0
        period = min(1.0, timeout_s / 10)  # silent after 3 periods: well inside the collective timeout
        beat = cls(dist.PrefixStore(PREFIX, client), rank, world, period, store_rank)
        beat.learn_peers(min(timeout_s, WHO_WAIT_S))
        return beat

    def learn_peers(self, wait_s: float) -> None:
        """Read every peer's identity (host, pid) as soon as all have written it: every rank starts its
        heartbeat right after the group forms, and a peer that stops within the loop's first period would
        otherwise be named without them (the store's host, once stopped, can no longer be read). A peer
        slower than wait_s is read by the loop later."""
        try:
            self._store.wait([f"who/{r}" for r in self.peers], timedelta(seconds=wait_s))
            who = {r: json.loads(self._store.get(f"who/{r}")) for r in self.peers}
        except Exception:  # noqa: BLE001 - a peer late to start (or gone): the loop keeps looking
            return
        with self._lock:
            self._who.update(who)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(f"beat/{self.rank}", 1)
                counts = {r: self._store.add(f"beat/{r}", 0) for r in self.peers}
                for r in [r for r in self.peers if r not in self._who and self._store.check([f"who/{r}"])]:
                    self._who[r] = json.loads(self._store.get(f"who/{r}"))
            except Exception:  # noqa: BLE001 - a stalled or gone store: _last_ok stops moving, which silent_peers reads
                pass
            else:
                now = time.monotonic()
                with self._lock:
                    self._last_ok = now
                    for r, c in counts.items():
                        if c != self._count.get(r):
                            self._count[r], self._moved[r] = c, now
            self._check_watch()
            self._stop.wait(self.period_s)

    def watch(self, limit_s: float, on_lost: Callable[[list[Silent]], None]) -> None:
        """From now on, call on_lost(lost) once, on the heartbeat thread, when a peer (or the store's host)
        has been silent for more than limit_s."""
        with self._lock:
            self._watch = (limit_s, on_lost)

    def _check_watch(self) -> None:
        with self._lock:
            if self._watch is None:
                return
            limit, on_lost = self._watch
            lost = self._silent_for(limit)
        lost = [s for s in lost if not self._finished(s.rank)]  # a peer that ended its run is not lost
        if lost:
            with self._lock:
                self._watch = None  # once
            on_lost(lost)

    def _finished(self, rank: int | None) -> bool:
        try:
            return rank is not None and self._store.check([f"done/{rank}"])
        except Exception:  # noqa: BLE001 - the store is gone: nobody said they finished
            return False

    def finish(self) -> None:
        """Say this rank's run ended normally (peers' watches stop counting its silence), then stop."""
        try:
            self._store.set(f"done/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - best effort: a peer's watch then acts after its limit
            pass
        self.stop()

    def _silent(self, rank: int | None, age_s: float) -> Silent:
        return Silent(rank, age_s, **self._who.get(rank, {}))

    def silent_peers(self) -> list[Silent]:
        """The peers (or the store's host) whose heartbeat stopped, longest silent first."""
        with self._lock:
            return self._silent_for(SILENT_PERIODS * self.period_s)

    def _silent_for(self, limit: float) -> list[Silent]:
        """Who has been silent for more than limit seconds (the caller holds the lock)."""
        now = time.monotonic()
        if now - self._last_ok > limit:  # this rank cannot reach the store: its host went silent
            return [] if self.store_rank == self.rank else [self._silent(self.store_rank, now - self._last_ok)]
        lost = [self._silent(r, now - t) for r, t in self._moved.items() if now - t > limit]
        return sorted(lost, key=lambda s: -s.age_s)

    def record_lost(self, message: str) -> None:
        """Leave the message in the store, for the local launcher (which hosts it) to report; skipped
        when the store itself stopped answering (a call would block until the store's timeout)."""
        with self._lock:
            answering = time.monotonic() - self._last_ok <= SILENT_PERIODS * self.period_s
        if answering:
            try:
                self._store.set("lost", message)
            except Exception:  # noqa: BLE001 - best effort: the message is raised and printed too
                pass

    def stop(self) -> None:
        """End the thread (without waiting on a store call that hangs: the thread is a daemon)."""
        self._stop.set()
        self._thread.join(timeout=2 * self.period_s)


def read_lost(store: dist.Store) -> str | None:
    """The message a rank recorded in the launcher's store (Heartbeat.record_lost), if any."""
    beats = dist.PrefixStore(PREFIX, store)
    return beats.get("lost").decode() if beats.check(["lost"]) else None


def on_this_machine(lost: list[Silent]) -> list[Silent]:
    """The silent ranks that run on this machine (same host name and pid namespace), not this process."""
    me = _identity()
    return [s for s in lost if s.rank is not None and s.pid and s.pid != me["pid"]
            and (s.host, s.pidns) == (me["host"], me["pidns"])]


def kill(ranks: list[Silent]) -> None:
    """SIGKILL these ranks' processes (on_this_machine's list)."""
    for s in ranks:
        try:
            os.kill(s.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def lost_message(lost: list[Silent], killing: list[Silent], rank: int, timeout_s: float) -> str:
    """One line: who stopped answering, for how long, what this rank saw and does about it."""
    who = "; ".join(f"{s.describe()} stopped answering: no heartbeat for {s.age_s:.1f} s" for s in lost)
    ended = ", ".join(f"rank {s.rank}" for s in killing)
    done = f"; rank {rank} ends {ended} (SIGKILL, same machine)" if killing else ""
    return f"{who} (found by rank {rank} when its collective failed, parallel.timeout_s={timeout_s:g}){done}"
