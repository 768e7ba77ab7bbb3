"""One rank's session, the same for `run`, `serve-bench` and `bench`: join the TP group, watch the peers, build
the Workers, and at the end free their graphs and leave the group.

    with RankSession(cfg) as session:              # the group (RANK set) or tp = 1 here; the peer watch
        worker = session.worker(cfg)               # FaultyWorker where parallel.fail_rank names this rank
        ...                                        # session.release(worker): its graphs freed, forgotten
    # every Worker still held: graphs freed, then the group left (the reverse order hangs NCCL)

A peer that stops answering is named and ended (parallel/peer_watch.py): on leaving the block with an error, a
silent peer turns it into RankLostError; once a Worker's all-reduce runs in symmetric memory (no collective
timeout of its own) the watch is armed, and a peer silent for parallel.timeout_s ends this rank even while it is
blocked on the device. The group is left through the first held Worker's group, which carries the all-reduce
(its drain is bounded at shutdown), else through the group joined.
"""

from __future__ import annotations

from tp_runtime.config import RunConfig
from tp_runtime.executor.shard import ModelShard
from tp_runtime.executor.worker import FaultyWorker, Worker
from tp_runtime.parallel.group import TPGroup, group_from_env, shutdown
from tp_runtime.parallel.peer_watch import PeerWatch


class RankSession:
    """Context manager: this rank's group, its peer watch and the Workers built on it."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.workers: list[Worker] = []
        self.tp: TPGroup | None = None
        self.watch: PeerWatch | None = None

    def __enter__(self) -> RankSession:
        p = self.cfg.parallel
        self.tp = group_from_env(self.cfg.runtime.device, p.backend, p.timeout_s)
        try:
            self.watch = PeerWatch(self.tp, p.timeout_s).__enter__()
        except BaseException:
            shutdown(self.tp)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:  # a silent peer turns an error into RankLostError naming it
            self.watch.__exit__(exc_type, exc, tb)
        finally:
            self.close()

    def worker(self, cfg: RunConfig, tp: TPGroup | None = None, oneshot: bool = False,
               shard: ModelShard | None = None) -> Worker:
        """A Worker of cfg on tp (the session's group by default), held until released or the session ends;
        FaultyWorker where cfg.parallel.fail_rank names this rank. Arms the watch for a symmetric-memory
        all-reduce."""
        worker_cls = FaultyWorker if cfg.parallel.fail_rank == self.tp.rank else Worker
        w = worker_cls(cfg, self.tp if tp is None else tp, oneshot=oneshot, shard=shard)
        self.workers.append(w)
        if w.tp.allreduce is not None and w.tp.allreduce.uses_symm:
            self.watch.arm()
        return w

    def release(self, worker: Worker) -> None:
        """Free a Worker's graphs and stop holding it (its memory goes with the last reference)."""
        worker.release_graphs()
        self.workers = [w for w in self.workers if w is not worker]

    def close(self) -> None:
        """Free every held Worker's graphs, then leave the group (through the group carrying the all-reduce)."""
        group = self.workers[0].tp if self.workers else self.tp
        workers, self.workers = self.workers, []

        def release() -> None:
            for w in workers:
                w.release_graphs()

        shutdown(group, release if workers else None)
