"""What every part of one rank's bench shares: the launch's group, the settings, the machine's facts, the
partial log, the progress bar, the rank's session (peer watch, Workers), and the all-reduce latencies measured
so far."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from tp_runtime.bench.measure import allreduce_ms
from tp_runtime.bench.projection import LEFT_OUT
from tp_runtime.bench.sweep_config import BenchSettings
from tp_runtime.engine.session import RankSession
from tp_runtime.parallel.group import TPGroup


@dataclass
class BenchEnv:
    tp: TPGroup
    s: BenchSettings
    machine: dict
    launcher: str
    name: str
    session: RankSession | None = None  # builds the lanes' Workers (the peer watch armed where they need it)
    bar: tqdm | None = None
    log: Path | None = None  # rank 0 appends every point's records here as soon as they exist
    allreduce_cache: dict = field(default_factory=dict)

    def keep(self, records: list[dict]) -> list[dict]:
        """Append records to the log (a sweep stopped part-way keeps its finished points); returns them."""
        if self.log is not None and records:
            with self.log.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        return records

    def allreduce(self, tp: TPGroup, batch: int, hidden: int, dtype: torch.dtype) -> dict:
        """All-reduce latency of the step's message [batch, hidden] through a lane's group (its strategy);
        measured once per strategy setting and shape (collective: every rank asks in the same order)."""
        if tp.size > 1 and not tp.has_peers:  # a projected shard: its all-reduce is left out, not measured
            return {"allreduce_ms_eager": None, "allreduce_ms_graph": None, "allreduce_ms_path": LEFT_OUT}
        key = (tp.allreduce.requested if tp.allreduce is not None else None, batch, hidden, dtype)
        if key not in self.allreduce_cache:
            self.allreduce_cache[key] = allreduce_ms(tp, (batch, hidden), dtype, self.s.allreduce_iters)
        return self.allreduce_cache[key]
