"""The fastest launch of each kernel kind at every Flash shape and M the tune timed (tune/fp8_gemm_tune.jsonl.gz),
in us, fastest first; wgmma_ws_w8 is the warp-specialized kernel with two MMA warpgroups in one partition.
    python benchmarks/results/h200-2026-12-03-fp8-gemm-ws/kernel_comparison.py"""
import gzip
import json
from pathlib import Path

best: dict[tuple, dict[str, tuple[float, dict]]] = {}
for line in gzip.open(Path(__file__).parent / "tune" / "fp8_gemm_tune.jsonl.gz", "rt"):
    r = json.loads(line)
    if "ms" not in r or "config" not in r:
        continue
    c = r["config"]
    kind = c["kernel"] + (f"_w{c['num_warps']}" if c["kernel"] == "wgmma_ws" else "")
    by_kind = best.setdefault((r["N"], r["K"], r["groups"], r["M"]), {})
    if kind not in by_kind or r["ms"] < by_kind[kind][0]:
        by_kind[kind] = (r["ms"], c)
for (n, k, g, m), by_kind in sorted(best.items()):
    ranked = sorted(by_kind.items(), key=lambda kv: kv[1][0])
    ws = by_kind.get("wgmma_ws_w4")
    tile = f"  ws: bm{ws[1]['block_m']} bn{ws[1]['block_n']} s{ws[1]['splits']} st{ws[1]['num_stages']}" if ws else ""
    print(f"N={n:5d} K={k:4d} g={g} M={m:3d}  " + "  ".join(f"{kind} {v[0] * 1e3:.1f}" for kind, v in ranked) + tile)
