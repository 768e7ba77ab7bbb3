"""Launch configurations of the sparse-attention kernel on a prefill chunk (Flash dims, bf16, one H200).

    python -m benchmarks.attention_prefill_sweep [--tokens 512,2048] [--contexts 4096,32768] [--out DIR]

A chunk is T tokens of one sequence at positions ctx - T .. ctx - 1 (slot 0): their window rows come from the
chunk itself and the ring, ratio 4 tokens attend to 512 picks each (random distinct completed entries), ratio
128 tokens to every completed entry. Each configuration (heads a program, candidates a block, warps, stages;
and the wgmma kernel's ring shapes) runs the same inputs; its output is compared with the default
configuration's (`attn_config`; max abs difference: the online softmax visits the same candidates in blocks of
another size, so bf16-rounded outputs may differ in the last bit) and its replay in a CUDA graph is timed
(graph_timer.graph_timing: 10 ms of warm-up, 60 ms of replays, the L2 flushed before each; median).
TFLOP/s counts the QK and PV dots: T x heads x candidates x D x 4. Prints a table and one JSON line; writes
attention_prefill_sweep.jsonl (bench/record_file.py) to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tp_runtime.bench.record_file import write_records
from tp_runtime.config import ModelConfig
from tp_runtime.graph_timer import graph_timing
from tp_runtime.model.rope import RotaryTable
from tp_runtime.model.step_index import ring_index
from tp_runtime.ops.sparse_attention import WGMMA, AttnConfig, attn_config, sparse_attention_sink
from tp_runtime.ops.sparse_attention_wgmma import wgmma_attention_fits

DEV, DT = torch.device("cuda"), torch.bfloat16
M = ModelConfig()
H, D, W, K = M.num_attention_heads, M.head_dim, M.sliding_window, M.index_topk
CONFIGS = [(64, 32, 8, 2), (64, 64, 8, 2), (64, 16, 8, 2), (64, 32, 8, 3), (64, 32, 8, 5), (64, 16, 8, 5),
           (64, 32, 4, 2), (32, 32, 8, 2), (32, 64, 8, 2), (32, 32, 4, 2), (16, 64, 4, 2), (16, 32, 4, 2),
           WGMMA, WGMMA._replace(block_n=32, num_stages=3), WGMMA._replace(block_n=32, num_stages=4)]


def chunk_inputs(T: int, ctx: int, ratio: int) -> tuple:
    g = torch.Generator(device=DEV).manual_seed(0)
    pos = torch.arange(ctx - T, ctx, device=DEV)
    slot = torch.zeros(T, dtype=torch.long, device=DEV)
    ring = ring_index(W, slot, pos, torch.zeros_like(pos), torch.full_like(pos, ctx - T),
                      torch.full_like(pos, ctx - 1), 1)
    table = RotaryTable(M.qk_rope_head_dim, M.compress_rope_theta, M.rope_scaling, ctx + 1, DEV)
    randn = lambda *s, sc=1.0: (torch.randn(*s, generator=g, device=DEV) * sc).to(DT)
    n_done = (pos + 1) // ratio
    comp = randn(2, ctx // ratio + 1, D)
    if ratio == 4:
        pad = lambda p: torch.nn.functional.pad(p, (0, K - p.numel()), value=-1)  # valid picks first, then -1
        picks = torch.stack([pad(torch.randperm(int(n), device=DEV, generator=g)[:K]) for n in n_done.tolist()])
        n_comp = K
    else:
        picks, n_comp = None, ctx // ratio
    return (randn(T, H, D, sc=3.0), randn(T, D), randn(2, W, D), ring, comp, slot, picks, n_done, n_comp,
            torch.randn(H, generator=g, device=DEV), D ** -0.5, table.at(pos))


def graph_ms(fn) -> float:
    return graph_timing(fn, DEV, budget_ms=(10, 60), flush_l2=True).median_ms


def point(T: int, ctx: int, ratio: int) -> list[dict]:
    args = chunk_inputs(T, ctx, ratio)
    cand = W + args[8]
    out_ref = torch.empty(T, H * D, dtype=DT, device=DEV)
    fits = wgmma_attention_fits(DEV, H, D, 64, DT)
    default = attn_config(T, H, cand, D, torch.cuda.get_device_properties(DEV).multi_processor_count, wgmma=fits)
    sparse_attention_sink(*args, out_ref, config=default)
    flop = T * H * (W + min(args[8], K if ratio == 4 else args[8])) * D * 4
    rows = []
    for entry in CONFIGS:
        c = entry if isinstance(entry, AttnConfig) else AttnConfig(*entry, -(-cand // entry[1]) * entry[1])
        out = torch.empty_like(out_ref)
        try:
            ms = graph_ms(lambda: sparse_attention_sink(*args, out, config=c))
            diff = float((out.float() - out_ref.float()).abs().max())
        except Exception as e:  # registers or shared memory the configuration cannot have
            ms, diff = None, None
            print(f"  {c}: {type(e).__name__}: {str(e)[:100]}", flush=True)
        rows.append({"tokens": T, "context": ctx, "ratio": ratio, "config": c._asdict(), "default": c == default,
                     "ms": ms, "tflops": flop / ms / 1e9 if ms else None, "max_abs_diff": diff})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--out", default="out/attention_prefill")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    rows = [r for ctx in map(int, a.contexts.split(",")) for T in map(int, a.tokens.split(",")) if T <= ctx
            for ratio in (4, 128) for r in point(T, ctx, ratio)]
    print(f"{'T':>5} {'ctx':>6} {'r':>4} {'bh':>3} {'bn':>3} {'nw':>3} {'ns':>3} {'ms':>8} {'TFLOP/s':>8} {'diff':>8}")
    for r in rows:
        c = r["config"]
        print(f"{r['tokens']:>5} {r['context']:>6} {r['ratio']:>4} {c['block_h']:>3} {c['block_n']:>3} "
              f"{c['num_warps']:>3} {c['num_stages']:>3} {r['ms'] or float('nan'):8.3f} "
              f"{r['tflops'] or float('nan'):8.1f} {r['max_abs_diff'] if r['max_abs_diff'] is not None else '-':>8}"
              + ("  (default)" if r["default"] else ""))
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    write_records(Path(a.out) / "attention_prefill_sweep.jsonl", [res], settings=vars(a))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
