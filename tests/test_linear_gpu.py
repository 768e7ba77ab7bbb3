"""The weight GEMMs (ops/linear.py) on a GPU: the Triton kernels with FP8 weights against
dequantize-then-matmul at every FP8 weight shape of Flash and Pro at tp 1 / 2 / 4 / 8 and M in
{1, 3, 16, 128, 512} (small M splits K); the path `fp8_linear` takes by M (x rounded to e4m3: the FP8 GEMM
family, tests/test_fp8_gemm_gpu.py); grouped, in FP8 and
bf16, against per-group matmuls; split-K results identical call after call and in a CUDA graph; then
`check` with FP8 weights.

Run on a GPU machine: `pytest -m gpu tests/test_linear_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT, last_json, run_cli
from tp_runtime.config import load_config
from tp_runtime.ops.linear import LinearConfig, dequantize, fp8_path, grouped_linear, linear_triton, tile_config
from tp_runtime.verify.check import tolerance
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import fp8_gemm_shapes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Both sides multiply the same dequantized bf16 values with fp32 accumulation; they differ in summation
# order and round the output to bf16 (2^-8 relative per element), so 1e-2 in norm bounds them while a
# wrong scale (a factor of 2 at least) or a missing block fails by far.
TOL = 1e-2
MS = [1, 3, 16, 128, 512]


def fp8_shapes(name: str, tp: int) -> set[tuple[int, int]]:
    """(N, K) of every FP8 GEMM one rank runs, wo_a per group (weights/specs.py)."""
    shapes = fp8_gemm_shapes(load_config(ROOT / "configs" / f"{name}.yaml").model, tp).values()
    return {(n // groups, k) for n, k, groups in shapes}


SHAPES = sorted({s for name in ("v4_flash", "v4_pro") for tp in (1, 2, 4, 8) for s in fp8_shapes(name, tp)})


@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_matches_dequantize_then_matmul(n, k):
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
    q, s = quantize_fp8(w)
    ref_w = dequantize(q, s, torch.bfloat16)
    for m in MS:
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        poison = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        del poison  # its block is what the kernel's output most likely reuses: unwritten elements stay NaN
        y = linear_triton(x, q, s)
        ref = x @ ref_w.T
        assert y.isfinite().all(), (n, k, m)
        err = float((y.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL, (n, k, m, err)


def test_kernel_in_a_cuda_graph():
    q, s = quantize_fp8(torch.randn(4096, 1024, device="cuda") / 32)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    y0 = linear_triton(x, q, s)  # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = linear_triton(x, q, s)
    x.copy_(torch.randn_like(x))
    g.replay()
    assert torch.equal(y, linear_triton(x, q, s)) and not torch.equal(y, y0)


@pytest.mark.parametrize("activations", ["bf16", "e4m3"])
def test_check_with_fp8_weights(activations):
    # e4m3: the released GEMMs, x rounded per 1 x 128 block (prefill chunks of up to 256 rows take the launches
    # that read x and qr rounded by the launches that norm them; the oracle rounds the same way)
    extra = ["runtime.fp8_activations=e4m3"] if activations == "e4m3" else []
    proc = run_cli(["check", "configs/v4_flash.yaml", "model.layers=2-5", "workload.requests=4",
                    "workload.prompt_len=[130, 700]", "workload.decode_len=[8, 24]", "runtime.max_len=1024",
                    "runtime.max_seqs=4", "runtime.max_tokens_per_step=256", "parallel.tp=1",
                    "parallel.launcher=local", "graph.mode=full_and_breakable", "runtime.weight_format=fp8", *extra],
                   timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = last_json(proc.stdout)
    print({k: v["max_rel_err"] for k, v in rec["comparisons"].items()})
    # bf16 activations: the bf16 bound; e4m3: the check's bound for rounded activations (verify/check.py
    # ROUNDED_X_TOLERANCE: the run rounds bf16 values, the oracle float64 ones, one e4m3 step apart at midpoints)
    bound = 3e-2 if activations == "bf16" else tolerance("bfloat16", "bf16", "e4m3")
    assert rec["ok"] and rec["comparisons"]["vs_reference"]["max_rel_err"] < bound


@pytest.mark.parametrize("groups,n,k", [(8, 1024, 4096), (4, 1024, 4096), (1, 1024, 4096), (16, 1024, 4096)])
def test_grouped_kernel_matches_per_group_matmuls(groups, n, k):
    # wo_a of Flash / Pro at tp 1, 2, 8 (and Pro tp 1): groups x [n, k] in one launch.
    g = torch.Generator(device="cuda").manual_seed(groups)
    q, s = quantize_fp8(torch.randn(groups * n, k, device="cuda", generator=g) / k ** 0.5)
    w = dequantize(q, s, torch.bfloat16).view(groups, n, k)
    for m in MS:
        x = torch.randn(m, groups * k, device="cuda", generator=g).to(torch.bfloat16)
        ref = torch.cat([x[:, i * k:(i + 1) * k] @ w[i].T for i in range(groups)], dim=1)
        y = linear_triton(x, q, s, groups)
        err = float((y.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL, (groups, m, err)


@pytest.mark.parametrize("groups,n,k", [(8, 1024, 4096), (4, 1024, 4096), (16, 1024, 4096), (2, 32, 200)])
def test_bf16_grouped_kernel_matches_per_group_matmuls(groups, n, k):
    # wo_a in the run dtype: one strided bmm (and the Triton kernel) reading x's groups in place; K = 200 is
    # not a multiple of 128.
    g = torch.Generator(device="cuda").manual_seed(groups + k)
    w = (torch.randn(groups * n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    for m in MS:
        x = torch.randn(m, groups * k, device="cuda", generator=g).to(torch.bfloat16)
        ref = torch.cat([x[:, i * k:(i + 1) * k] @ w[i * n:(i + 1) * n].T for i in range(groups)], dim=1)
        for y in (grouped_linear(x, w, groups), linear_triton(x, w, None, groups)):  # cuBLAS; the kernel in bf16
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            assert y.isfinite().all() and err < TOL, (groups, m, err)


def test_decode_sizes_split_k():
    # The split that decode relies on: wo_b at M = 1 runs in several K splits, summed by the last program.
    assert tile_config(1, 4096, 8192, torch.cuda.get_device_properties(0).multi_processor_count).splits > 1
    assert tile_config(4096, 4096, 8192, 132).splits == 1  # prefill: partials would outweigh the weight


@pytest.mark.parametrize("n,k", [(1536, 4096), (4096, 8192), (200, 1000)])
def test_gemv_configs_with_several_scale_blocks_a_step(n, k):
    # GEMV steps of 512 columns span four scale blocks; k = 1000 ends inside one; splits that leave a split
    # with fewer steps than others. Against dequantize-then-matmul, FP8 and bf16.
    g = torch.Generator(device="cuda").manual_seed(n + k)
    q, s = quantize_fp8(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5)
    w = dequantize(q, s, torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
    ref = (x.float() @ w.float().T)
    for c in (LinearConfig(1, 8, 512, 4, 3, 3), LinearConfig(1, 32, 128, 8, 3, 1), LinearConfig(1, 16, 512, 8, 3, 1)):
        for y in (linear_triton(x, q, s, 1, c), linear_triton(x, w, None, 1, c)):
            err = float((y.float() - ref).norm() / ref.norm())
            assert y.isfinite().all() and err < TOL, (c, err)


@pytest.mark.parametrize("m,config", [(1, LinearConfig(1, 16, 512, 4, 3, 8)), (8, LinearConfig(16, 64, 128, 4, 3, 6)),
                                      (32, LinearConfig(32, 64, 128, 4, 3, 3))])
def test_split_k_is_deterministic_and_leaves_its_counters_zero(m, config):
    # The last split of a tile sums the partials in split order and resets the tile's counter: the same
    # bits on every call and every graph replay (a counter left non-zero would make the next call skip or
    # double its sum).
    q, s = quantize_fp8(torch.randn(4096, 8192, device="cuda") / 90)
    x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
    y0 = linear_triton(x, q, s, 1, config)
    ref = x.float() @ dequantize(q, s, torch.float32).T
    assert float((y0.float() - ref).norm() / ref.norm()) < TOL
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = linear_triton(x, q, s, 1, config)
    for _ in range(3):
        g.replay()
        assert torch.equal(y, y0)
        assert torch.equal(linear_triton(x, q, s, 1, config), y0)


def test_fp8_path_by_rows():
    # On x as given: GEMV at M = 1, else the tile kernel; torch off CUDA (x rounded to e4m3: ops/fp8_gemm.py).
    x = torch.empty(1, 1024, device="cuda", dtype=torch.bfloat16)
    assert [fp8_path(m, x) for m in (1, 2, 32, 33, 512)] == ["gemv"] + ["tile"] * 4
    assert fp8_path(512, x.cpu()) == "torch"
