"""The bytes a decode step must move per kernel group (bench/group_bytes.py), by hand, and their bandwidth share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tp_runtime.bench.group_bytes import attention_bytes, bandwidth_shares, group_bytes, indexer_bytes
from tp_runtime.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_group_bytes_by_hand_tiny():
    """tiny dims (hidden 64, H 8, D 32, Rq 32, W 16, Ih 8, Id 16, K 8), tp 2 (4 local heads), fp32 (4 B),
    batch 3 at context 150; layers [0, 4, 128, 4, 128, 0]."""
    m = load_config(CONFIGS / "tiny.yaml").model
    # Matrices a layer: wq_b 8*32*32/2 + wo_a 64*64/2 + wo_b 64*64/2 + wq_a+wkv 64*64 = 12288 values = 49152 B;
    # r = 128 adds its compressor's 2*32*64 = 16384 B; r = 4 its compressor 2*64*64 (32768 B), the indexer's
    # wq_b 8*16*32 + weights_proj 8*64 (18432 B) and the indexer's compressor 2*32*64 (16384 B).
    swa, hca, csa = 49152, 49152 + 16384, 49152 + 32768 + 18432 + 16384
    # Attention a token: q read + output written 2 * 4 heads * 32 * 4 B = 1024; rows of 32 * 4 = 128 B:
    # r = 0 16 window rows; r = 4 16 + min(8, 150 // 4) = 8 picks (and 8 * 8 B of indices); r = 128 16 + 1.
    att = {0: 16 * 128 + 1024, 4: 24 * 128 + 1024 + 64, 128: 17 * 128 + 1024}
    assert {r: attention_bytes(m, r, 2, 3, 150, 4, False) for r in att} == {r: 3 * b for r, b in att.items()}
    # Indexer (r = 4) a token: 37 keys of 16 * 4 B, q 8 * 16 and 8 head weights * 4 B, 8 picks written.
    idx = 37 * 64 + 8 * 17 * 4 + 8 * 8
    assert indexer_bytes(m, 4, 3, 150, 4, False) == 3 * idx and indexer_bytes(m, 128, 3, 150, 4, False) == 0
    assert group_bytes(m, 2, 3, 150, 4) == {
        "weight GEMMs": 2 * (swa + csa + hca), "attention": 3 * (2 * att[0] + 2 * att[4] + 2 * att[128]),
        "indexer": 2 * 3 * idx, "all-reduce": 6 * 3 * 64 * 4}  # the layer output once a layer (tp > 1)
    assert "all-reduce" not in group_bytes(m, 1, 3, 150, 4)


def test_group_bytes_fp8_caches_flash():
    """Flash dims (H 64, D 512, W 128, K 512, Ih 64, Id 128), one token at 32K, bf16 activations: FP8 rows of
    592 bytes and keys of 132 bytes as stored (ops/cache_fp8.py)."""
    m = load_config(CONFIGS / "v4_flash.yaml").model
    assert attention_bytes(m, 4, 1, 1, 32768, 2, True) == (128 + 512) * 592 + 2 * 64 * 512 * 2 + 512 * 8
    assert attention_bytes(m, 4, 1, 1, 32768, 2, False) == (128 + 512) * 1024 + 2 * 64 * 512 * 2 + 512 * 8
    assert indexer_bytes(m, 4, 1, 32768, 2, True) == 8192 * 132 + 64 * 129 * 2 + 512 * 8
    # A tp 8 rank reads the same rows for its 8 heads: only q and the output shrink.
    assert attention_bytes(m, 128, 8, 1, 32768, 2, True) == (128 + 256) * 592 + 2 * 8 * 512 * 2


def test_bandwidth_shares():
    shares = bandwidth_shares({"attention": 10**9, "indexer": 10**9}, {"attention": 1.0, "indexer": 0.0}, 2e12)
    assert shares["attention"] == pytest.approx(0.5)  # 1 GB in 1 ms is 1 TB/s, half of 2 TB/s
    assert shares["indexer"] is None  # no GPU time recorded for the group


def test_bandwidth_table_lists_each_group_of_each_profiled_point():
    from tp_runtime.bench.report import bandwidth_table

    base = dict(variant="v", mode="full", batch=128, context=32768, cache_format="fp8", weight_format="bf16")
    profiled = dict(base, profile_view_bytes={"weight GEMMs": 10**9, "attention": 2 * 10**9},
                    profile_view_ms={"weight GEMMs": 0.5, "attention": 4.0},
                    profile_view_bw_share={"weight GEMMs": 0.5, "attention": 0.125})
    table = bandwidth_table([profiled, dict(base, batch=1, profile_view_bytes={}, profile_view_bw_share=None)])
    lines = table.splitlines()[2:]
    assert len(lines) == 2  # the point without a view has no rows
    assert "weight GEMMs" in lines[0] and lines[0].split()[-4:] == ["0.500", "1000.0", "2000", "50%"]
    assert "attention" in lines[1] and lines[1].split()[-4:] == ["4.000", "2000.0", "500", "12%"]


def test_a_profile_with_a_view_gets_each_groups_share():
    """lane_record.profile on a tiny CPU Worker, given a view's GPU ms as a GPU run would record them."""
    import torch

    from tp_runtime.bench.lane_record import profile
    from tp_runtime.bench.record import Point
    from tp_runtime.executor.worker import Worker
    from tp_runtime.parallel.group import single_process

    cfg = load_config(CONFIGS / "tiny.yaml", ["runtime.device=cpu", "graph.mode=eager"])
    w = Worker(cfg, single_process(torch.device("cpu")))
    point = Point(3, 150, "base")
    nbytes = group_bytes(cfg.model, 1, 3, 150, w.dtype.itemsize)
    plain = profile({"gpu_busy_ms": None}, 1.0, w, point, 1, 2.0)
    assert plain.profile_view_bytes == nbytes and plain.profile_view_bw_share is None
    view = {g: 1e-3 for g in ("weight GEMMs", "attention", "indexer", "norms and rotary")} | {"total": 4e-3}
    shares = profile({"gpu_busy_ms": 4e-3, "profile_view_ms": view}, 1.0, w, point, 1, 2.0).profile_view_bw_share
    assert set(shares) == set(nbytes)  # groups without a byte model get no share
    assert shares["attention"] == pytest.approx(nbytes["attention"] / 1e-6 / 2e9)  # 1 us of a 2 GB/s roofline


def test_the_kernel_bandwidth_sweep_profiles_both_cache_formats():
    from tp_runtime.bench.sweep_config import load_sweep

    sweep = load_sweep(CONFIGS / "bench_kernel_bandwidth.yaml")
    assert sweep.grid["bench.batch"] == [1, 8, 32, 128, 256] and sweep.grid["bench.context"] == [4096, 32768]
    assert sweep.bench.profile and sweep.bench.profile_steps > 0
    formats = [sweep.worker_config(1, sweep.variants()[0], mode).runtime.cache_format for mode in sweep.modes]
    assert formats == ["bf16", "fp8"]
