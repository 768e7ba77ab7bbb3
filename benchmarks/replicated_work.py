"""What sharding a rank's replicated work over tp would save, per layer, at Flash dims on one GPU.

    python -m benchmarks.replicated_work OUT_DIR

At tp = k every rank today computes the same indexer and compressor work (replicated weights, replicated
caches). Two ways to split it, and what each costs in collectives:

  indexer heads   rank r scores Ih/k of the 64 indexer heads (its rows of indexer.wq_b and weights_proj),
                  the partial scores [T, n_keys] fp32 are all-reduced, then every rank selects the same
                  top-K. Saves: the indexer query GEMM's rows and the score kernel's heads. Costs: one
                  all-reduce of T * n_keys * 4 bytes per ratio-4 layer.
  compressor      rank r projects and pools D/k channels of each compressed entry (gated pooling is per
  channels        channel); the entry's RMSNorm needs the whole row, so the pooled slices are all-gathered
                  (T x 2D for r = 4) before norm, rotary and the replicated cache write. Saves: the
                  compressor rows of the fused x GEMM. Costs: one all-gather per compressed layer.

This script measures the kernels that change, captured in CUDA graphs and replayed (graph_timer.graph_timing:
25 ms of warm-up, 200 ms of replays, the L2 flushed before each; median), at each k: the indexer query GEMM
and the Triton score + top-K launches at Ih/k heads (bf16 keys, every key of a full graph's n_keys live), and
the fused x GEMM of a ratio-4 layer with its compressor rows cut to 1/k. The collectives cannot be measured on
one GPU: the table states the time saved beside the message size, and the verdict uses a stated collective
latency (5 us, and the 10.8-12.8 us NCCL measured in a graph on two H200s for 8-64 KB). Prints a table and one
JSON line; writes replicated_work.jsonl (bench/record_file.py) to OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from tp_runtime.bench.record_file import version_of, write_records
from tp_runtime.config import ModelConfig
from tp_runtime.graph_timer import graph_timing
from tp_runtime.ops.indexer_topk import indexer_topk

DEV = torch.device("cuda")
M = ModelConfig()
IH, ID, RQ, HID, D, K = M.index_n_heads, M.index_head_dim, M.q_lora_rank, M.hidden_size, M.head_dim, M.index_topk
DT = torch.bfloat16
COLLECTIVE_US = (5.0, 12.0)  # stated all-reduce / all-gather latencies per layer (see the docstring)


def graph_us(fn) -> float:
    """Median us of one replay of fn captured in a CUDA graph (warmed up first)."""
    return 1e3 * graph_timing(fn, DEV, budget_ms=(25, 200), flush_l2=True).median_ms


def indexer_us(batch: int, n_keys: int, heads: int) -> float:
    """Indexer query GEMM [batch, RQ] x [heads*ID, RQ]^T + scores over `heads` heads + top-K, one token per
    sequence, every one of n_keys keys live."""
    qr = torch.randn(batch, RQ, device=DEV, dtype=DT)
    wq = torch.randn(heads * ID, RQ, device=DEV, dtype=DT) * RQ ** -0.5
    w = torch.randn(batch, heads, device=DEV, dtype=DT)
    keys = torch.randn(batch + 1, n_keys, ID, device=DEV, dtype=DT)
    slot = torch.arange(batch, device=DEV)
    n_valid = torch.full((batch,), n_keys, device=DEV, dtype=torch.long)

    def step():
        q = F.linear(qr, wq).view(batch, heads, ID)
        indexer_topk(q, w, keys, slot, n_valid, n_keys, K)

    return graph_us(step)


def x_gemm_us(batch: int, comp_rows: int) -> float:
    """The ratio-4 layer's fused x GEMM with `comp_rows` rows of compressor projections (the rest whole)."""
    rows = RQ + D + comp_rows + IH + 2 * 2 * ID
    x = torch.randn(batch, HID, device=DEV, dtype=DT)
    w = torch.randn(rows, HID, device=DEV, dtype=DT) * HID ** -0.5
    return graph_us(lambda: F.linear(x, w))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder of replicated_work.jsonl")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    rows = []
    for batch in (1, 32):
        for ctx in (4096, 32768):
            n_keys = (ctx + 4432) // 4  # the full graph's key bound at runtime.max_len = ctx + decode room
            base_ix, base_x = indexer_us(batch, n_keys, IH), x_gemm_us(batch, 2 * 2 * D)
            for k in (2, 4, 8):
                ix = indexer_us(batch, n_keys, IH // k)
                xg = x_gemm_us(batch, 2 * 2 * D // k)
                rows.append(dict(batch=batch, context=ctx, tp=k, n_keys=n_keys,
                                 indexer_us=round(base_ix, 2), indexer_sharded_us=round(ix, 2),
                                 indexer_saved_us=round(base_ix - ix, 2), scores_allreduce_bytes=batch * n_keys * 4,
                                 x_gemm_us=round(base_x, 2), x_gemm_comp_sharded_us=round(xg, 2),
                                 compressor_saved_us=round(base_x - xg, 2),
                                 entries_allgather_bytes=batch * 2 * D * 4))
                print(json.dumps(rows[-1]), flush=True)
    verdict = {f"{what}_wins_at_{us}us": [r for r in rows if r[f"{what}_saved_us"] > us]
               for what in ("indexer", "compressor") for us in COLLECTIVE_US}
    verdict = {key: [(r["batch"], r["context"], r["tp"]) for r in v] for key, v in verdict.items()}
    print(f"{'batch':>5} {'ctx':>6} {'tp':>3} | {'indexer us':>10} {'sharded':>8} {'saved':>6} {'AR bytes':>9} |"
          f" {'x GEMM us':>9} {'sharded':>8} {'saved':>6} {'AG bytes':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['context']:>6} {r['tp']:>3} | {r['indexer_us']:>10.1f} "
              f"{r['indexer_sharded_us']:>8.1f} {r['indexer_saved_us']:>6.1f} {r['scores_allreduce_bytes']:>9} |"
              f" {r['x_gemm_us']:>9.1f} {r['x_gemm_comp_sharded_us']:>8.1f} {r['compressor_saved_us']:>6.1f}"
              f" {r['entries_allgather_bytes']:>9}")
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=version_of("triton"))
    result = dict(env=env, rows=rows, verdict=verdict, collective_us=COLLECTIVE_US)
    write_records(a.out / "replicated_work.jsonl", [result], settings=vars(a))
    print(json.dumps(dict(env=env, verdict=verdict)))


if __name__ == "__main__":
    main()
