"""The FP8 GEMM family's tuning table: which launch (ops/fp8_gemm.py's Fp8GemmConfig) each weight shape takes at
each M bucket, as measured on a GPU by `python -m benchmarks.fp8_gemm_tune` and committed beside this file
(fp8_gemm_table.json). Read once when the Triton backend is built.

    key     "N,K,groups": the weight [N, K] as one rank holds it (wo_a: all of its groups), groups of x's columns
    bucket  the smallest of M_BUCKETS >= M (M above the last: the last bucket's launch, tiled over M)

A shape missing from the table gets `default_config` and one warning per shape, never an error; a cuBLASLt
entry where cuBLASLt's block-scaled GEMM cannot run (not SM90 / cuBLASLt < 12.9, x not bf16), or a Gluon entry
where that kernel cannot (no Gluon, not a Hopper GPU), gets the same.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from tp_runtime.ops.fp8_gemm import GLUON_KERNELS, Fp8GemmConfig, default_config
from tp_runtime.ops.kernel_support import gluon_hopper
from tp_runtime.ops.linear import BLOCK, blockwise_scaled_mm_available

TABLE_PATH = Path(__file__).with_name("fp8_gemm_table.json")
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def m_bucket(m: int) -> int:
    """The table's row for M rows: the smallest bucket >= m, or the last."""
    return next((b for b in M_BUCKETS if b >= m), M_BUCKETS[-1])


def shape_key(n: int, k: int, groups: int) -> str:
    return f"{n},{k},{groups}"


class Fp8GemmTable:
    """Launch configurations by (shape, M bucket); `config` is the one lookup the backend makes per GEMM call."""

    def __init__(self, entries: dict[str, dict[int, Fp8GemmConfig]], source: str = "(none)"):
        self.entries, self.source = entries, source
        self._warned: set[str] = set()

    @classmethod
    def load(cls, path: Path = TABLE_PATH) -> Fp8GemmTable:
        """The committed table (an absent file: an empty table, every shape on its default)."""
        if not path.is_file():
            return cls({}, f"{path} (absent)")
        raw = json.loads(path.read_text())
        entries = {key: {int(b): Fp8GemmConfig(**c) for b, c in by_m.items()} for key, by_m in raw["entries"].items()}
        return cls(entries, str(path))

    def config(self, m: int, n: int, k: int, groups: int, x: torch.Tensor, n_sm: int) -> Fp8GemmConfig:
        """The launch for an [m, n] output over k columns per group on x's device."""
        key = shape_key(n, k, groups)
        c = self.entries.get(key, {}).get(m_bucket(m))
        if c is None:
            return self._fallback(key, f"FP8 GEMM shape N={n} K={k} groups={groups} is not in the tuning table "
                                       f"{self.source}", m, n, k, groups, n_sm)
        if c.kernel == "gemv" and m != 1:
            return self._fallback(key, f"the GEMV launch for N={n} K={k} takes one row, not {m}", m, n, k, groups, n_sm)
        if c.kernel == "scaled_mm" and not (x.is_cuda and groups == 1 and k % BLOCK == 0 and x.dtype == torch.bfloat16
                                            and blockwise_scaled_mm_available(x.device)):
            return self._fallback(key, f"cuBLASLt's block-scaled GEMM, the table's choice for N={n} K={k}, cannot "
                                       f"run here", m, n, k, groups, n_sm)
        if c.kernel in GLUON_KERNELS and not gluon_hopper(x.device):
            return self._fallback(key, f"the Gluon kernel, the table's choice for N={n} K={k}, cannot run here "
                                       f"(it needs Triton's Gluon and a Hopper GPU)", m, n, k, groups, n_sm)
        return c

    def _fallback(self, key: str, why: str, m: int, n: int, k: int, groups: int, n_sm: int) -> Fp8GemmConfig:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{why}: using a default launch (python -m benchmarks.fp8_gemm_tune makes the table)",
                          stacklevel=3)
        return default_config(m, n, k, n_sm)
