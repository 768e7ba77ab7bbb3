"""Prefill chunks with FP8 rows: the one-role Gluon kernel against the warp-specialized one (graph replays, L2
flushed, median), 64 heads, one 2,048-token chunk at positions 2048..4095 and one 512-token chunk."""
import sys

import torch

sys.path.insert(0, "tests")
from test_fp8_cache_gpu import fp8_attention_case  # noqa: E402
from test_kernels_gpu import rel_err  # noqa: E402

from tp_runtime.graph_timer import graph_timing  # noqa: E402
from tp_runtime.ops.sparse_attention import WGMMA, WGMMA_WS, sparse_attention_sink  # noqa: E402
from tp_runtime.ops.torch_path import sparse_attention_sink as twin  # noqa: E402

dev = torch.device("cuda")
for chunks in ([(0, 2048, 2048)], [(0, 3584, 512)]):
    for ratio in (4, 128):
        T, args = fp8_attention_case(chunks, 64, ratio, torch.bfloat16, seed=11)
        ref = torch.empty(T, 64 * 512, dtype=torch.bfloat16, device=dev)
        twin(*args, ref)
        line = [f"chunk {chunks[0][2]} ratio {ratio}"]
        for name, cfg in (("wgmma", WGMMA), ("wgmma_ws", WGMMA_WS), ("wgmma", WGMMA), ("wgmma_ws", WGMMA_WS)):
            out = torch.empty_like(ref)
            fn = lambda: sparse_attention_sink(*args, out, config=cfg)  # noqa: E731
            fn()
            ms = graph_timing(fn, dev, budget_ms=(5, 40), flush_l2=True).median_ms
            line.append(f"{name} {ms * 1e3:.1f} us (err {rel_err(out, ref):.1e})")
        print(" | ".join(line), flush=True)
