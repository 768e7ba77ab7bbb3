"""The symmetric-memory all-reduce on GPUs (pytest -m gpu; skipped below 2 CUDA GPUs): parity with NCCL at
many sizes in bf16 and fp32, back-to-back calls inside one CUDA graph, every rank's result equal, a tp = 2 run
that matches NCCL's, and a dead or stopped rank ending the run within the stated bound (parallel.timeout_s +
10 s: parallel/allreduce.py). Ranks are real processes (torchrun, the local launcher), each command
bounded by a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from conftest import MARK, REPO, TINY, child_env, last_json, reap, run_cli, stopped_at

N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(N_GPUS < 2, reason="needs 2 CUDA GPUs")]
NO_MULTICAST = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
SYMM = ["runtime.device=cuda", "parallel.launcher=local"]


def _gpu_env() -> dict[str, str]:
    return child_env(**NO_MULTICAST)


def _tolerance(dtype: str, ranks: int, ref_max: float) -> float:
    """0 at 2 ranks: a + b rounds once on either path, so NCCL and the symm kernels agree bit for bit. At 4
    ranks the summation orders differ; each partial sum rounds once more: a few units of the last place of
    the largest value (bf16: 2^-8 relative, fp32: 2^-24), one per extra addend."""
    if ranks == 2:
        return 0.0
    ulp = 2.0 ** -8 if "bfloat16" in dtype else 2.0 ** -24
    return (ranks - 1) * 2 * ulp * max(ref_max, 1.0)


@pytest.mark.parametrize("ranks", [r for r in (2, 4) if r <= N_GPUS])
def test_parity_with_nccl_eager_and_in_one_graph(tmp_path, ranks):
    out = tmp_path / "parity.json"
    env = _gpu_env()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                        str(REPO / "tests" / "allreduce_gpu_ranks.py"), str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert not reap(env[MARK])
    res = json.loads(out.read_text())
    d = res["describe"]
    assert d["symm_one_shot"]["allreduce_path"] == "symm_one_shot" and d["symm_two_shot"]["allreduce_buffer_bytes"] > 0
    assert d["auto"]["allreduce_probe_us"], d["auto"]  # auto measured its threshold
    symm_taken = set()
    for row in res["eager"] + res["graph"]:
        assert row["ranks_equal"], row
        assert row["max_abs"] <= _tolerance(row.get("dtype", "bfloat16"), ranks, row["ref_max"]), row
        symm_taken.add((row["path"], row["took"]))
    # the kernels were used (aligned sizes within the buffer), and the rest went to NCCL
    assert {("symm_one_shot", "symm_one_shot"), ("symm_two_shot", "symm_two_shot")} <= symm_taken
    assert ("symm_one_shot", "nccl") in symm_taken  # unaligned or past the buffer
    big = [row for row in res["eager"] if row["numel"] == 640 * 4096 and row["dtype"] == "torch.bfloat16"]
    assert big and all(row["took"] == "nccl" for row in big)


def _run(overrides: list[str], timeout_s: float = 300):
    return run_cli(["run", TINY, *SYMM, *overrides], timeout_s=timeout_s, env=_gpu_env())


def test_a_tp2_run_on_symmetric_memory_matches_nccl():
    recs = {}
    for ar in ("nccl", "symm_one_shot", "symm_two_shot", "auto"):
        r = _run([f"parallel.allreduce={ar}", "graph.mode=full_and_breakable"])
        assert r.returncode == 0, r.stderr[-4000:]
        recs[ar] = last_json(r.stdout)
    assert recs["nccl"]["allreduce"] == "nccl"
    assert recs["symm_one_shot"]["allreduce_path"] == "symm_one_shot"
    assert recs["symm_two_shot"]["allreduce_path"] == "symm_two_shot"
    for ar, rec in recs.items():
        assert rec["completed"] == 8 and rec["replayed_fraction"] > 0.5, (ar, rec)
        # fp32 at tp = 2: a + b on either path (see _tolerance); the rest of the step is the same code
        assert rec["output_checksum"] == pytest.approx(recs["nccl"]["output_checksum"], rel=1e-6), ar


def test_a_killed_rank_ends_a_symmetric_memory_run_in_bounded_time():
    t0 = time.monotonic()
    r = _run(["parallel.allreduce=symm_one_shot", "graph.mode=full", "parallel.fail_rank=1", "parallel.fail_step=5",
              "parallel.timeout_s=10"], timeout_s=120)
    assert r.returncode == 1, r.stderr[-4000:]
    assert "rank 1 failed" in r.stderr or "rank 1" in r.stderr.strip().splitlines()[-1], r.stderr[-3000:]
    assert time.monotonic() - t0 < 90  # start-up (~30 s with capture) + the bound (timeout_s + 10 s)


def test_a_stopped_rank_ends_a_symmetric_memory_run_within_the_timeout():
    timeout_s = 10
    r = _run(["parallel.allreduce=symm_one_shot", "graph.mode=full", "parallel.fail_rank=1", "parallel.fail_mode=stop",
              "parallel.fail_step=5", f"parallel.timeout_s={timeout_s}"], timeout_s=120)
    assert r.returncode == 1, r.stderr[-4000:]
    assert "rank 1 (host " in r.stderr and "stopped answering" in r.stderr, r.stderr[-3000:]
    after = r.ended - stopped_at(r.stderr, 1)
    assert after < timeout_s + 10 + 5, after  # the bound, plus the launcher's teardown
