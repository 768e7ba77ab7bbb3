"""A sweep's memory per rank against this machine's devices, checked before any rank starts.

    check_sweep_memory(sweep)     # `tp-runtime bench`: ConfigError naming the grid keys and sizes, or nothing

Per (tp, model variant) group, every rank holds one shard (weights, caches) per distinct runtime section
of its modes' Workers (bench/lanes.py shares the rest, shard_key) and a workspace per Worker; rank 0 at
tp > 1 also holds the tp = 1 baselines (bench.compare_tp1). Sizes are memory_model.py's, budgets memory_fit.py's.
"""

from __future__ import annotations

from tp_runtime.bench.lanes import shard_key
from tp_runtime.bench.sweep_config import SweepConfig
from tp_runtime.config import ConfigError, RunConfig
from tp_runtime.memory_fit import Budget, device_budget, device_type, refusal
from tp_runtime.memory_model import rank_memory

# What sets a bench rank's memory (the bench sizes its Workers from the grid), named when it does not fit.
BENCH_ADVICE = {"weights": "the weights are set by the model and grid 'parallel.tp': select fewer layers",
                "caches": "the caches are set by grid 'bench.batch' and 'bench.context' (and the bench.* steps "
                          "per point, which lengthen every sequence): lower them",
                "workspace": "the workspace is set by grid 'bench.batch', 'bench.context' and bench.prefill_chunk: "
                             "lower them"}


def _group_memory(sweep: SweepConfig, tp: int, variant: tuple, kind: str) -> tuple[dict, dict, RunConfig]:
    """Bytes by part on rank 0 and on any other rank of one (tp, variant) group: one shard per distinct
    runtime section of its modes' Workers (bench/lanes.py shares the rest), a workspace per Worker, and on
    rank 0 at tp > 1 the tp = 1 baselines' shards and Workers too (bench.compare_tp1)."""

    def held(cfgs: list[RunConfig]) -> dict[str, int]:
        parts, shards = {"weights": 0, "caches": 0, "workspace": 0}, set()
        for cfg in cfgs:
            mem = rank_memory(cfg, kind)
            if shard_key(cfg) not in shards:
                shards.add(shard_key(cfg))
                parts["weights"] += mem["weights"]
                parts["caches"] += mem["caches"]
            parts["workspace"] += mem["workspace"]
        return parts

    workers = [sweep.worker_config(tp, variant, m) for m in sweep.modes]
    others = held(workers)
    baselines = [sweep.worker_config(1, variant, m) for m in sweep.modes] if tp > 1 and sweep.bench.compare_tp1 else []
    rank0 = {k: v + held(baselines)[k] for k, v in others.items()} if baselines else others
    return rank0, others, workers[0]


def check_sweep_memory(sweep: SweepConfig) -> None:
    """Refuse a sweep whose ranks cannot hold their Workers on this machine's devices (memory_fit.py): per
    GPU the largest rank 0 of any group; on a CPU, rank 0 and the tp - 1 others of a group together."""
    for tp in sweep.tps:
        for variant in sweep.variants():
            cfg = sweep.worker_config(tp, variant, sweep.modes[0])
            kind = device_type(cfg)
            budget = device_budget(cfg, kind)
            if budget is None:
                continue
            rank0, others, cfg = _group_memory(sweep, tp, variant, kind)
            what = f"rank 0 of the group at tp={tp} ({len(sweep.modes)} mode(s))"
            if budget.ranks_here > 1:  # one host holds them all: rank 0's and the others' together
                rank0 = {k: v + (tp - 1) * others[k] for k, v in rank0.items()}
                budget, what = Budget(budget.bytes, budget.what, 1), f"the {tp} ranks of the group at tp={tp}"
            if msg := refusal(cfg, rank0, budget, what, BENCH_ADVICE):
                raise ConfigError(msg)
