"""Joining a group whose ranks host their own store (Ray's ranks): parallel/group.py's `init_from_env`.

Two CPU processes (gloo) with parallel.timeout_s = 3: rank 0 reaches the rendezvous 8 s after rank 1, as a rank
may on a loaded machine. The ranks still form the group (they wait up to RENDEZVOUS_TIMEOUT_S for each other), and
once it has formed the store's calls and the collectives wait parallel.timeout_s again: a peer that stays away is
still found after parallel.timeout_s, not after the join's bound.
"""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import REPO, child_env, free_port

RANK = """
import os, sys, time
import torch, torch.distributed as dist
from tp_runtime.parallel.group import init_from_env
rank = int(sys.argv[1])
if rank == 0:
    time.sleep(8)  # late to the rendezvous: more than parallel.timeout_s
tp = init_from_env("cpu", "gloo", 3.0)
x = torch.full((4,), float(rank + 1))
dist.all_reduce(x)
print(f"rank {rank} sum {x[0].item():g}", flush=True)
print(f"rank {rank} store timeout {dist.distributed_c10d._get_default_store().timeout.total_seconds():g}", flush=True)
if rank == 0:
    time.sleep(10)  # away from the next collective: rank 1's must fail after about 3 s
    os._exit(0)  # no teardown of a group whose peer gave up (gloo may abort in it)
t0 = time.monotonic()
try:
    dist.all_reduce(x)
    print("rank 1 second all-reduce returned", flush=True)
except Exception as e:
    print(f"rank 1 second all-reduce failed after {time.monotonic() - t0:.1f} s: {type(e).__name__}", flush=True)
os._exit(0)
"""


def test_ranks_meet_at_their_store_beyond_the_collective_timeout_which_still_applies_after() -> None:
    env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], cwd=REPO, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (1, 0)]
    outs = [p.communicate(timeout=120) for p in procs]
    elapsed = time.monotonic() - t0
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-3000:]
    rank1, rank0 = outs[0][0], outs[1][0]
    assert "rank 0 sum 3" in rank0 and "rank 1 sum 3" in rank1, (rank0, rank1)
    # the store's calls are back to parallel.timeout_s once the ranks have met
    assert "rank 0 store timeout 3\n" in rank0 and "rank 1 store timeout 3\n" in rank1, (rank0, rank1)
    # the group's collectives keep parallel.timeout_s (3 s; gloo measured 3.0), far from RENDEZVOUS_TIMEOUT_S (180 s)
    failed = [ln for ln in rank1.splitlines() if "second all-reduce failed" in ln]
    assert failed and float(failed[0].split("after ")[1].split(" s")[0]) < 9, rank1
    assert elapsed < 60, elapsed
