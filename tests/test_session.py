"""`run`, `serve-bench` and `bench` enter through the one rank session (engine/session.py): each command's CPU
path at tp = 1, from the command line in this process, joins and leaves through RankSession, builds its Workers
through it, and leaves holding none; a Worker that fails to build leaves the session's group as it found it."""

from __future__ import annotations

import pytest

from conftest import REPO, TINY_PATH
from tp_runtime import cli
from tp_runtime.config import load_config
from tp_runtime.engine.session import RankSession
from tp_runtime.executor.worker import FaultyWorker, Worker


@pytest.fixture
def sessions(monkeypatch):
    """Every RankSession entered, with the Workers it built and how many it still held when it ended."""
    seen: list[dict] = []
    enter, worker, close = RankSession.__enter__, RankSession.worker, RankSession.close

    def on_enter(self):
        seen.append({"session": self, "workers": [], "held_at_close": None})
        return enter(self)

    def on_worker(self, *args, **kwargs):
        w = worker(self, *args, **kwargs)
        next(s for s in seen if s["session"] is self)["workers"].append(w)
        return w

    def on_close(self):
        next(s for s in seen if s["session"] is self)["held_at_close"] = len(self.workers)
        close(self)

    monkeypatch.setattr(RankSession, "__enter__", on_enter)
    monkeypatch.setattr(RankSession, "worker", on_worker)
    monkeypatch.setattr(RankSession, "close", on_close)
    return seen


def test_run_enters_through_the_session(sessions, tmp_path, capsys):
    status = cli.main(["run", TINY_PATH, "parallel.tp=1", "parallel.launcher=local", "workload.requests=2",
                       "workload.prompt_len=[8,12]", "workload.decode_len=[2,3]"])
    assert status == 0, capsys.readouterr().err
    assert len(sessions) == 1 and len(sessions[0]["workers"]) == 1
    assert sessions[0]["held_at_close"] == 1  # run's Worker is freed by the session as it ends


def test_serve_bench_enters_through_the_session(sessions, tmp_path, capsys):
    status = cli.main(["serve-bench", str(REPO / "configs/serve_tiny.yaml"), "grid.modes=[eager,breakable-narrow]",
                       "grid.concurrency=[2]", "grid.rate=[]", "serve.requests=2", "serve.repeats=1",
                       "serve.warmup_requests=0", "serve.plots=false", f"serve.output={tmp_path}"])
    assert status == 0, capsys.readouterr().err
    assert len(sessions) == 1 and len(sessions[0]["workers"]) == 2  # a Worker per mode, one shard
    assert sessions[0]["workers"][0].shard is sessions[0]["workers"][1].shard
    assert sessions[0]["held_at_close"] == 2


def test_bench_enters_through_the_session(sessions, tmp_path, capsys):
    status = cli.main(["bench", str(REPO / "configs/bench_tiny.yaml"), "grid.parallel.tp=[1]", "grid.bench.batch=[1]",
                       "grid.bench.context=[12]", "bench.repeats=1", "bench.plots=false", f"bench.output={tmp_path}"])
    assert status == 0, capsys.readouterr().err
    assert len(sessions) == 1 and len(sessions[0]["workers"]) == 1
    assert sessions[0]["held_at_close"] == 0  # the lanes were released after their group


def test_the_session_builds_the_faulty_worker_where_fail_rank_names_this_rank():
    cfg = load_config(TINY_PATH, ["parallel.tp=1", "runtime.device=cpu"])
    with RankSession(cfg) as session:
        plain = session.worker(cfg)
        assert type(plain) is Worker and session.workers == [plain]
        session.release(plain)
        assert session.workers == []
        faulty = session.worker(load_config(TINY_PATH, ["parallel.tp=1", "runtime.device=cpu",
                                                        "parallel.fail_rank=0"]), shard=plain.shard)
        assert isinstance(faulty, FaultyWorker)
    assert session.workers == []


def test_a_failure_inside_the_session_still_leaves_the_group(monkeypatch):
    cfg = load_config(TINY_PATH, ["parallel.tp=1", "runtime.device=cpu"])
    left = []
    monkeypatch.setattr("tp_runtime.engine.session.shutdown", lambda tp, release=None: left.append(tp))
    with pytest.raises(RuntimeError, match="boom"):
        with RankSession(cfg) as session:
            raise RuntimeError("boom")
    assert left == [session.tp]
