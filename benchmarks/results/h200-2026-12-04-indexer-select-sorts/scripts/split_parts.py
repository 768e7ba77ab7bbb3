"""The split select in parts (batch 1, 8, 128 at 32K; bf16 and FP8 keys): the kernel stopped after the
threshold bin, after its run's lists, after the count, without the threshold bin's candidates, in full
(sort of up to 512 or 256 candidates) and with the candidates resolved in registers by histogram digits.
Each timing restores the bins from a copy first (the copy timed alone). Graph replays, L2 flushed, median of
3 interleaved rounds. Also the threshold bin's candidate counts. python bench_tmp/diag/split_parts.py"""
import importlib.util
import statistics
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.indexer_sweep import K, N_KEYS, inputs, variant_config  # noqa: E402
from tp_runtime.graph_timer import graph_timing  # noqa: E402
from tp_runtime.ops import indexer_topk as itk  # noqa: E402
from tp_runtime.ops.kernel_support import triton  # noqa: E402

spec = importlib.util.spec_from_file_location("tsel", "bench_tmp/diag/tsel.py")
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)
dev = torch.device("cuda")
VARIANTS = {  # name: (STOP, FINISH, RANK_N)
    "threshold bin only": (1, 0, 512),
    "run lists, no count": (2, 0, 512),
    "count, no finish": (3, 0, 512),
    "finish, picks only": (0, 1, 512),
    "full, sort 512": (0, 0, 512),
    "full, sort 256": (0, 0, 256),
    "full, resolve 512": (0, 2, 512),
}


def launch(scores, hist, nv, out, cfg, stop, finish, rank_n):
    T, n_keys = scores.shape
    runs = triton.cdiv(n_keys, cfg.chunk)
    part = torch.empty(T, runs, cfg.chunk, dtype=torch.int32, device=dev)
    cnt = torch.empty(T, runs, 2, dtype=torch.int32, device=dev)
    cand = torch.empty(T, n_keys, dtype=torch.int32, device=dev)
    min_n = min(1024, cfg.chunk)
    ts.split_select_kernel[(T, runs)](
        scores, scores.stride(0), hist, hist.stride(0), part, cnt, cand, cand.stride(0), nv, out, out.stride(0),
        n_keys, K, runs, SLICE=cfg.chunk, R_P2=triton.next_power_of_2(runs), K_P2=triton.next_power_of_2(K),
        RANK_N=rank_n, MIN_N=min_n, LEVELS=(cfg.chunk // min_n).bit_length(), HI_BITS=cfg.hi_bits,
        LO_BITS=cfg.lo_bits, LO_PASSES=-(-(32 - cfg.hi_bits) // cfg.lo_bits), CHUNK=cfg.chunk, PDL=False,
        STOP=stop, FINISH=finish, num_warps=cfg.select_warps)


def parts(batch, ctx, fp8):
    (q, w, keys, slot, nv), kw = inputs(batch, ctx, fp8, dev)
    ks = kw.get("key_scales")
    cfg = variant_config("default", batch, 132, fp8)
    hist = torch.zeros(batch, (1 << cfg.hi_bits) + 1, dtype=torch.int32, device=dev)
    scores = torch.empty(batch, N_KEYS, dtype=torch.float32, device=dev)
    out = torch.empty(batch, K, dtype=torch.long, device=dev)
    itk._launch_scores(q, w, keys, ks, slot, nv, K, cfg, False, False, scores, hist, bins_from=cfg.chunk)
    saved = hist.clone()
    ref = itk.indexer_topk(q, w, keys, slot, nv, N_KEYS, K, config=cfg, key_scales=ks).sort(dim=1).values
    # candidates in the threshold bin, per token
    n = int(nv[0])
    key = scores[:, :n].contiguous().view(torch.int32).long()
    key = torch.where(key < 0, key ^ 0x7FFFFFFF, key) + 2 ** 31
    digit = key >> (32 - cfg.hi_bits)
    kth = digit.sort(dim=1, descending=True).values[:, K - 1:K]
    n_cand = (digit == kth).sum(dim=1).tolist()
    fns = {"bins copy": lambda: hist.copy_(saved)}
    same = {}
    for name, (stop, finish, rank_n) in VARIANTS.items():
        fns[name] = lambda a=(stop, finish, rank_n): (hist.copy_(saved), launch(scores, hist, nv, out, cfg, *a))
        if stop == 0 and finish != 1:
            out.fill_(-7)
            fns[name]()
            same[name] = bool(torch.equal(out.sort(dim=1).values, ref))
    samples = {n: [] for n in fns}
    for _ in range(3):
        for nm, f in fns.items():
            samples[nm].append(1e3 * graph_timing(f, dev, budget_ms=(5, 30), flush_l2=True).median_ms)
    print(f"batch {batch} ctx {ctx} keys {'fp8' if fp8 else 'bf16'}: threshold-bin candidates min / median / max "
          f"{min(n_cand)} / {statistics.median(n_cand)} / {max(n_cand)}; same picks: {same}")
    for nm, v in samples.items():
        print(f"    {nm:24s} {statistics.median(v):7.1f} us   ({', '.join(f'{x:.1f}' for x in v)})")
    sys.stdout.flush()


for batch in (1, 8, 128):
    for fp8 in (False, True):
        parts(batch, 32768, fp8)
