"""Bytes each timed MMA launch of this folder's tunes moves, beside its time: HBM (weight once, x, split-K partials)
and L2 -> SM (the weight once per M tile, x once per N tile, the partials). Reads tune*/fp8_gemm_tune.jsonl.gz;
prints the 4 fastest launches per (weight, M) at M = 32, 128, 256.

    python benchmarks/results/h200-2026-12-02-fp8-gemm-wgmma/traffic_of_timings.py
"""

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent


def traffic(r: dict) -> tuple[float, float] | None:
    """(HBM bytes, L2 -> SM bytes) of one timed MMA launch; None for cuBLASLt and the GEMV."""
    c, n, k, groups, m = r["config"], r["N"], r["K"], r["groups"], r["M"]
    if c["kernel"] in ("scaled_mm", "gemv"):
        return None
    m_tiles, n_tiles = math.ceil(m / c["block_m"]), math.ceil(n / c["block_n"])
    x_bytes = 2 if c["kernel"] == "triton" and c["quant_x"] else 1  # bf16 x rounded in the kernel, else e4m3
    partials = 2 * 4 * m * n * c["splits"] if c["splits"] > 1 else 0
    hbm = n * k + m * k * groups * x_bytes + partials
    return hbm, n * k * m_tiles + n_tiles * m_tiles * c["block_m"] * k * x_bytes + partials


def main() -> None:
    runs = defaultdict(list)
    for path in sorted(HERE.glob("tune*/fp8_gemm_tune.jsonl.gz")):
        for r in map(json.loads, gzip.open(path, "rt")):
            if "ms" in r and "config" in r and (t := traffic(r)):
                runs[(r["N"], r["K"], r["groups"], r["M"])].append((r["ms"], t, r["config"]))
    for key in sorted(runs):
        if key[3] in (32, 128, 256):
            print("N, K, groups, M =", key)
            for ms, (hbm, l2), c in sorted(runs[key], key=lambda t: t[0])[:4]:
                print(f"  {ms * 1e3:6.1f} us  HBM {hbm / 1e6:6.1f} MB ({hbm / ms / 1e9:4.2f} TB/s)  L2->SM {l2 / 1e6:6.1f} MB "
                      f"({l2 / ms / 1e9:4.2f} TB/s)  {c['kernel']} {c['block_m']}x{c['block_n']} splits {c['splits']}")


if __name__ == "__main__":
    main()
