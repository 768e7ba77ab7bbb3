"""`tp-runtime check`: the same workload run several ways, compared output by output.

    tp_vs_tp1               the configured tp and launcher against tp = 1 in this process
    incremental_vs_oneshot  chunked prefill + decode against each sequence prefilled whole (tp = 1)
    vs_reference            the configured run against the plain float64 oracle (reference.py), whose cached
                            rows are rounded as the run's runtime.cache_format stores them
    graph_vs_eager          (GPU, graph.mode=breakable) graph replay against the eager run of the same scope
    full_vs_eager           (graph.mode=full or full_and_breakable) the run whose decode-only steps take the
                            static full-graph path (replayed on a GPU, run eagerly on a CPU) against eager

The error of a comparison is max over requests and tokens of ||a_t - b_t|| / ||b_t||. A NaN or
infinite value on either side fails the comparison, naming the side, the request and its first
non-finite position (an error computed from it would be NaN, which no tolerance test catches).

With FP8 caches the report also carries `measured.fp8_vs_bf16_cache`: the same run with bf16 caches
against the FP8 one, and the FP8 run against the oracle that does not round: what storing the caches
in FP8 costs the outputs. It is measured, not held to a tolerance.
"""

from __future__ import annotations

import copy

import torch

from tp_runtime.config import RunConfig, uses_fp8_weights
from tp_runtime.engine.entry import in_process, launch
from tp_runtime.executor.shard import resolve_dtype
from tp_runtime.engine.workload import build_workload
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import resolve_device, single_process
from tp_runtime.verify.reference import reference_stack
from tp_runtime.weights.fill import fill_weights, full_tensors

# Tolerance of a per-token relative error, by the run's dtype.
#  float64: ~1e-16 rounding grown through a few layers of GEMMs and softmaxes stays far below 1e-9.
#  float32: unit roundoff 6e-8; reductions over up to a few thousand terms (hidden, D, candidates)
#           and residual sums over the layers land near 1e-6, so 1e-5 leaves 10x headroom while a
#           wrong mask, position or sink (errors of 1e-2 and up) fails by orders of magnitude.
#  bfloat16: unit roundoff 4e-3 on every stored activation and weight; per-layer errors of ~5e-3
#           accumulate over the stack, and rounding can flip a borderline top-K pick, moving one of
#           hundreds of candidates; 3e-2 bounds that while a mathematical error still shows as >1e-1.
TOLERANCES = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 3e-2}
# With FP8 caches (runtime.cache_format=fp8), against the oracle that rounds its cached rows the same way.
# The run and the oracle round slightly different values (fp32 or bf16 arithmetic against float64): an
# element within that difference of an e4m3 rounding midpoint goes the other way, one e4m3 step (at most
# 2^-3 of its value). In float32 that is ~3e-5 of the elements (error ~1e-6 over a step of 2^-4); a
# few such flips over a run move an output by up to ~1e-2 (tiny dims, 6 layers, 6 requests: 6.2e-3
# measured; 2e-7 for the runs with no flip), so 1e-2. A wrong rounding rule (unrounded in-step rows,
# e4m3 rope dims, non-power-of-two scales) moves outputs by the rounding itself, which is what the bf16-
# cache run differs by: 4e-2 .. 2.6e-1 on the same scenario. float64 runs still pool and quantize in
# fp32, hence float32's bound. In bfloat16 a few percent of the elements flip; the bf16 tolerance stands.
FP8_CACHE_TOLERANCES = {"float64": 1e-2, "float32": 1e-2, "bfloat16": 3e-2}
# The same bounds hold with e4m3 indexer queries (runtime.indexer_q=e4m3, against the oracle that rounds them
# the same way), for the same reason: the run rounds fp32 or bf16 queries and the oracle float64 ones, so a
# query element at an e4m3 midpoint may go one step either way and flip a borderline top-K pick. The queries
# only choose entries, so without such a flip the dtype's own bound holds (float32 tiny scenario of
# tests/test_parity.py: 5.5e-7); an unrounded or wrongly rounded query changes the picks wholesale (0.17).


# With FP8 GEMMs rounding their activations to e4m3 (runtime.fp8_activations=e4m3), against the oracle that
# rounds the same inputs the same way (reference.py `_act_round`): the run rounds bf16 values and the oracle
# float64 ones, so an element within that difference of an e4m3 midpoint goes the other way, one e4m3 step
# (2^-3 of its value); with bf16's 2^-8 relative error that is a few percent of the elements of each GEMM input,
# moving a GEMM output by about 1 % (relative norm), five GEMM inputs a layer. 1e-1 bounds that, while a wrong
# activation scale (a factor of 2) or a block misplaced still moves the outputs by more.
ROUNDED_X_TOLERANCE = 1e-1


def tolerance(dtype: str, cache_format: str, fp8_activations: str = "bf16", indexer_q: str = "bf16") -> float:
    """The per-token relative error allowed between equal computations in `dtype` with these caches, FP8 GEMM
    activations and indexer queries."""
    tol = FP8_CACHE_TOLERANCES[dtype] if cache_format == "fp8" or indexer_q == "e4m3" else TOLERANCES[dtype]
    return max(tol, ROUNDED_X_TOLERANCE) if fp8_activations == "e4m3" else tol


def max_rel_err(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> float:
    """max over requests and tokens of ||a_t - b_t|| / ||b_t||; NaN when any token's error is NaN."""
    if set(a) != set(b):
        raise ValueError(f"compared runs completed different requests: {sorted(a)} vs {sorted(b)}")
    worst = torch.zeros((), dtype=torch.float64)
    for r in a:
        x, y = a[r].double(), b[r].double().to(a[r].device)
        err = (x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30)
        if err.numel():
            worst = torch.maximum(worst, err.max().cpu())  # propagates NaN (Python's max() would drop it)
    return float(worst)


def first_nonfinite(outputs: dict[int, torch.Tensor]) -> tuple[int, int] | None:
    """(request, position) of the first token holding a NaN or infinite value; None when all are finite."""
    for r in sorted(outputs):
        bad = ~torch.isfinite(outputs[r]).all(dim=-1)
        if bool(bad.any()):
            return r, int(bad.nonzero()[0, 0])
    return None


def compare(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor], sides: tuple[str, str], tol: float) -> dict:
    """One comparison's record {max_rel_err, tol, ok}; a non-finite output on either side fails it, and
    `nonfinite` says where: 'SIDE: request R position P' (max_rel_err is then null)."""
    for side, out in zip(sides, (a, b)):
        if (where := first_nonfinite(out)) is not None:
            return {"max_rel_err": None, "tol": tol, "ok": False,
                    "nonfinite": f"{side}: request {where[0]} position {where[1]}"}
    err = max_rel_err(a, b)
    return {"max_rel_err": err, "tol": tol, "ok": bool(err <= tol)}


def _variant(cfg: RunConfig, **changes: dict) -> RunConfig:
    out = copy.deepcopy(cfg)
    for section, values in changes.items():
        for k, v in values.items():
            setattr(getattr(out, section), k, v)
    return out


def reference_outputs(cfg: RunConfig, requests: list[int], cache_format: str | None = None,
                      indexer_q: str | None = None) -> dict[int, torch.Tensor]:
    """The oracle's final hidden states per request, float64, on the run's device; its cached rows rounded
    as `cache_format` (default: the run's runtime.cache_format) stores them, its indexer queries as
    `indexer_q` (default: the run's runtime.indexer_q) scores them."""
    device = resolve_device(cfg.runtime.device)
    dtype = resolve_dtype(cfg.runtime.dtype, device)
    stack = AttentionStack(cfg.model, single_process(device), cfg.runtime.max_len, dtype, device,
                           fp8=uses_fp8_weights(cfg, device))
    fill_weights(stack, cfg.model.checkpoint, cfg.runtime.seed)
    # The oracle sees the run's weights exactly (already rounded to the run's dtype, or FP8 weights
    # dequantized: exact), in float64. With FP8 weights the Triton GEMMs differ from it only by accumulation
    # order (fp32 sums per 128-column block) on top of bf16 activations: the bf16 tolerance holds. With
    # runtime.fp8_activations=e4m3 the oracle rounds the FP8 GEMMs' inputs as the run does (ROUNDED_X_TOLERANCE).
    round_x = uses_fp8_weights(cfg, device) and cfg.runtime.fp8_activations == "e4m3"
    w = {k: v.double() for k, v in full_tensors(stack).items()}
    del stack
    workload = build_workload(cfg)
    out = {}
    with torch.no_grad():
        for r in workload.requests:
            if r.id in requests:
                x = workload.request_inputs(r, device, dtype).double()
                out[r.id] = reference_stack(x, w, cfg.model, cache_format or cfg.runtime.cache_format, round_x,
                                            indexer_q or cfg.runtime.indexer_q).cpu()
    return out


def run_check(cfg: RunConfig) -> dict:
    main = launch(cfg, keep_outputs=True)
    eager1 = _variant(cfg, parallel={"tp": 1, "launcher": "local"}, graph={"mode": "eager"})
    tp1 = in_process(eager1, keep_outputs=True)
    oneshot = in_process(eager1, oneshot=True, keep_outputs=True)
    tol = tolerance(main.dtype, cfg.runtime.cache_format, cfg.runtime.fp8_activations, cfg.runtime.indexer_q)
    run = f"tp={cfg.parallel.tp} {cfg.parallel.launcher}"
    comparisons = {
        "tp_vs_tp1": compare(main.outputs, tp1.outputs, (run, "tp=1"), tol),
        "incremental_vs_oneshot": compare(tp1.outputs, oneshot.outputs, ("tp=1", "tp=1 one-shot"), tol),
        "vs_reference": compare(main.outputs, reference_outputs(cfg, list(main.outputs)), (run, "oracle"), tol),
    }
    if cfg.graph.mode == "breakable" and main.graph:
        eager = launch(_variant(cfg, graph={"mode": "eager"}), keep_outputs=True)
        # Replay runs the very kernels of the eager path on the same shapes but for padding rows,
        # so only reduction-order differences of padded GEMMs remain: well inside bf16 rounding.
        comparisons["graph_vs_eager"] = compare(main.outputs, eager.outputs, (f"{run} graphs", f"{run} eager"), tol)
    if cfg.graph.mode in ("full", "full_and_breakable"):
        eager = launch(_variant(cfg, graph={"mode": "eager"}), keep_outputs=True)
        # The static path computes the same function over larger, masked candidate sets (masked entries
        # weigh exactly 0): only the reduction order of the longer sums differs, within the dtype's
        # rounding. In bf16 a reordered indexer score may flip a borderline top-K pick, as in tp_vs_tp1.
        comparisons["full_vs_eager"] = compare(main.outputs, eager.outputs, (f"{run} full graphs", f"{run} eager"),
                                               tol)
    measured = _fp8_cache_cost(cfg, main.outputs) if cfg.runtime.cache_format == "fp8" else {}
    return {
        "command": "check",
        # Nothing completed (every request rejected) is nothing checked: not a pass.
        "ok": bool(main.outputs) and all(c["ok"] for c in comparisons.values()),
        "tp": cfg.parallel.tp,
        "launcher": cfg.parallel.launcher,
        "device": main.device,
        "dtype": main.dtype,
        "graph_mode": cfg.graph.mode if main.graph else "eager",
        "steps_by_path": main.steps_by_path,
        "break_scope": cfg.graph.break_scope,
        "requests": len(main.outputs),
        "rejected": [r.reason for r in main.rejected],
        "comparisons": comparisons,
        "measured": measured,
    }


def _fp8_cache_cost(cfg: RunConfig, fp8_outputs: dict[int, torch.Tensor]) -> dict:
    """What FP8 caches change in the outputs: the run with bf16 caches (same launcher, graphs and kernels)
    and the unrounded oracle, each against the FP8 run. Reported, never failed: the size of the rounding."""
    bf16 = launch(_variant(cfg, runtime={"cache_format": "bf16"}), keep_outputs=True)
    return {"fp8_vs_bf16_cache": {"max_rel_err": max_rel_err(fp8_outputs, bf16.outputs)},
            "fp8_vs_unrounded_reference": {
                "max_rel_err": max_rel_err(fp8_outputs, reference_outputs(cfg, list(fp8_outputs), "bf16"))}}
