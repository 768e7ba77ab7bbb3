"""FP8 weights as released (runtime.weight_format=fp8): config refusals, shard boundaries on 128-blocks,
the stored layout (seeded and from a checkpoint), the torch path of the FP8 GEMM, roofline bytes.

The FP8 GEMM's torch path dequantizes (exactly) and multiplies, so on the CPU an FP8 stack must compute
bit for bit what a stack holding the dequantized values computes. The Triton kernel: tests/test_linear_gpu.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import FP8_DIMS, ROOT, TINY_PATH as TINY, run_cli
from tp_runtime.bench.roofline import step_bytes
from tp_runtime.config import ConfigError, load_config
from tp_runtime.memory_model import layer_weight_bytes
from tp_runtime.model.layers import Linear
from tp_runtime.model.stack import AttentionStack
from tp_runtime.ops.fp8_gemm import fp8_gemm_torch
from tp_runtime.ops.linear import dequantize, fp8_linear
from tp_runtime.parallel.group import TPGroup
from tp_runtime.weights.checkpoint_read import load_checkpoint
from tp_runtime.weights.checkpoint_write import stored_values, write_checkpoint
from tp_runtime.weights.fill import draw_full, full_tensors, init_seeded
from tp_runtime.weights.fp8 import quantize_fp8
from tp_runtime.weights.specs import check_fp8_shards, model_specs

CPU = torch.device("cpu")
FLASH = ROOT / "configs" / "v4_flash.yaml"
SMALL = [*FP8_DIMS, "runtime.max_len=64"]


def _stack(cfg, tp: int = 1, rank: int = 0, fp8: bool = True) -> AttentionStack:
    return AttentionStack(cfg.model, TPGroup(rank, tp, CPU), cfg.runtime.max_len, torch.float32, CPU, fp8=fp8)


def test_fp8_is_refused_on_a_cpu_naming_the_key_and_device():
    with pytest.raises(ConfigError, match=r"'runtime.weight_format'=fp8 .*CUDA GPUs only; runtime.device=cpu"):
        load_config(TINY, ["runtime.weight_format=fp8", "runtime.device=cpu", *SMALL])
    with pytest.raises(ConfigError, match=r"must be one of \['bf16', 'fp8'\]"):
        load_config(TINY, ["runtime.weight_format=fp4"])
    proc = run_cli(["run", TINY, "runtime.weight_format=fp8", "parallel.launcher=local", *SMALL], timeout_s=60)
    assert proc.returncode == 2 and "weight_format'=fp8" in proc.stderr and "Traceback" not in proc.stderr


def test_fused_wq_a_wkv_needs_whole_blocks():
    with pytest.raises(ConfigError, match=r"q_lora_rank=32 must be a multiple of 128"):
        load_config(TINY, ["runtime.weight_format=fp8"])


def test_shard_boundaries_inside_a_scale_block_are_refused_naming_the_tensor():
    flash = load_config(FLASH).model
    for tp in (1, 2, 4, 8):
        check_fp8_shards(flash, tp)  # the released dims shard on whole blocks
    small = load_config(TINY, SMALL).model
    check_fp8_shards(small, 4)
    odd = load_config(TINY, SMALL + ["model.o_lora_rank=96"]).model  # wo_a rows 4 x 96: 384 / 2 = 192
    with pytest.raises(ValueError, match=r"tp=2 splits layers\.0\.attn\.wo_a\.weight \[384, 256\] at row 192"):
        check_fp8_shards(odd, 2)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_seeded_fp8_shard_holds_the_quantized_draw(tp):
    cfg = load_config(TINY, SMALL)
    for rank in range(tp):
        st = _stack(cfg, tp, rank)
        init_seeded(st, 0)
        a = st.layers["1"].attn  # a CSA layer
        spec = next(s for s in model_specs(cfg.model, fp8=True) if s.name == "layers.1.attn.wq_b.weight")
        q, scale = quantize_fp8(draw_full(spec, 0, CPU))
        rows = q.shape[0] // tp
        assert torch.equal(a.wq_b.qweight.view(torch.uint8), q[rank * rows:(rank + 1) * rows].view(torch.uint8))
        assert torch.equal(a.wq_b.scale, scale[rank * rows // 128:(rank + 1) * rows // 128])
        assert a.wq_b.qweight.dtype == torch.float8_e4m3fn and not hasattr(a.wq_b, "weight")


def test_fp8_stack_equals_a_stack_of_its_dequantized_values():
    # full_tensors dequantizes; the same values in a plain stack must give the same outputs bit for bit.
    cfg = load_config(TINY, SMALL)
    fp8, plain = _stack(cfg), _stack(cfg, fp8=False)
    init_seeded(fp8, 0)
    values = full_tensors(fp8)
    for spec in model_specs(cfg.model):
        plain.get_parameter(spec.param).narrow(0, spec.row_offset, spec.shape[0]).copy_(values[spec.name])
        if spec.fp8:  # the FP8 round trip write-checkpoint stores (the rest keeps the run dtype)
            assert torch.equal(values[spec.name], stored_values(spec, draw_full(spec, 0, CPU))), spec.name
    x = torch.randn(5, cfg.model.hidden_size)
    for i in ("0", "1", "2"):
        a8, ap = fp8.layers[i].attn, plain.layers[i].attn
        assert torch.equal(a8.stage_a(x).qr, ap.stage_a(x).qr)
        o = torch.randn(5, a8.wo_a.qweight.shape[1] * a8.n_local_groups)
        # wo_a: the dequantized weights and the plain ones go through the same strided bmm, but float32
        # rounding may still differ (~1e-7 relative), so not bit equality.
        y8, yp = a8.stage_c(o), ap.stage_c(o)
        assert float((y8 - yp).norm() / yp.norm()) < 1e-6


def test_fp8_linear_torch_path_is_dequantize_then_matmul():
    w = torch.randn(300, 260) / 16
    q, s = quantize_fp8(w)
    x = torch.randn(3, 260)
    assert torch.equal(fp8_linear(x, q, s), x @ dequantize(q, s, torch.float32).T)
    assert float((dequantize(q, s, torch.float32) - w).abs().max()) <= float(w.abs().max()) / 8  # e4m3: 3 bits


def test_checkpoint_fp8_tensors_load_as_stored(tmp_path):
    cfg = load_config(TINY, SMALL)
    write_checkpoint(cfg, tmp_path, n_files=2)
    seeded, loaded = _stack(cfg, 2, 1), _stack(cfg, 2, 1)
    init_seeded(seeded, 0)
    rep = load_checkpoint(loaded, tmp_path)
    fp8_params = [(n, a, b) for (n, a), (_, b) in zip(seeded.named_parameters(), loaded.named_parameters())
                  if n.endswith((".qweight", ".scale"))]
    assert len(fp8_params) == 2 * (4 * 6 + 2)  # wx_fp8, wq_b, wo_a, wo_b in 6 layers, indexer.wq_b in 2 CSA
    for name, a, b in fp8_params:  # the stored bytes, unchanged (the rest is stored in bf16)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert rep["param_bytes"] < sum(p.numel() * 4 for p in _stack(cfg, 2, 1, fp8=False).parameters()) / 2


def test_roofline_counts_the_stored_fp8_bytes():
    m = load_config(FLASH).model
    bf16, fp8 = step_bytes(m, 1, 0, 0, 2), step_bytes(m, 1, 0, 0, 2, fp8=True)
    assert bf16.weights == pytest.approx(10.17e9, rel=5e-3)
    # The FP8 matrices at one byte (4.9 GB), the bf16 compressor and indexer projections and norms as
    # stored (0.5 GB): 5.40 GB, 0.53x the bf16 bytes.
    assert fp8.weights == pytest.approx(5.40e9, rel=5e-3)
    # One layer by hand: each FP8 matrix N*K bytes + one byte per 128 x 128 block, the rest in bf16.
    D, Rq, H, G, Ro, hid = m.head_dim, m.q_lora_rank, m.num_attention_heads, m.o_groups, m.o_lora_rank, m.hidden_size
    mats = [(Rq, hid), (D, hid), (H * D, Rq), (G * Ro, H * D // G), (hid, G * Ro)]
    fp8_bytes = sum(n * k + math.ceil(n / 128) * math.ceil(k / 128) for n, k in mats)
    assert layer_weight_bytes(m, 0, 1, 2, fp8=True) - fp8_bytes == layer_weight_bytes(m, 0, 1, 2) - 2 * sum(
        n * k for n, k in mats)


def test_bench_modes_name_a_weight_format():
    from tp_runtime.bench.sweep_config import load_sweep

    sweep = load_sweep(ROOT / "configs" / "bench_fp8.yaml")
    formats = {m: sweep.worker_config(1, sweep.variants()[0], m).runtime.weight_format for m in sweep.modes}
    assert formats == {"full": "bf16", "full@fp8": "fp8"}
    with pytest.raises(ConfigError, match=r"grid 'modes' holds \['full@fp4'\]"):
        load_sweep(ROOT / "configs" / "bench_fp8.yaml", ["grid.modes=[full,full@fp4]"])


def test_fp8_activations_need_fp8_weights_and_reach_the_gemms():
    # e4m3 activations round the inputs of FP8 GEMMs: refused without FP8 weights, naming both keys;
    # with them every FP8 linear of the stack is told (the GEMM path reads it: ops/linear.py fp8_path).
    with pytest.raises(ConfigError, match=r"'runtime.fp8_activations'=e4m3 .*runtime.weight_format=fp8"):
        load_config(TINY, ["runtime.fp8_activations=e4m3"])
    cfg = load_config(TINY, SMALL)
    stack = AttentionStack(cfg.model, TPGroup(0, 1, CPU), cfg.runtime.max_len, torch.float32, CPU, fp8=True,
                           round_x=True)
    fp8_linears = [m for m in stack.modules() if isinstance(m, Linear) and m.fp8]
    assert fp8_linears and all(m.round_x for m in fp8_linears)


def test_e4m3_activations_round_the_grouped_wo_a_input_too():
    # wo_a is one grouped GEMM outside Linear.forward: with round_x its input o is rounded per 1 x 128 block of
    # each group, as the oracle (verify/reference.py) and the released model round it. Same torch twin on both
    # sides, so bit equality.
    cfg = load_config(TINY, SMALL)
    stack = AttentionStack(cfg.model, TPGroup(0, 1, CPU), cfg.runtime.max_len, torch.float32, CPU, fp8=True,
                           round_x=True)
    init_seeded(stack, 0)
    a = stack.layers["0"].attn
    o = torch.randn(5, a.wo_a.qweight.shape[1] * a.n_local_groups)
    z = fp8_gemm_torch(o, a.wo_a.qweight, a.wo_a.scale, a.n_local_groups)
    assert torch.equal(a.stage_c(o), fp8_gemm_torch(z, a.wo_b.qweight, a.wo_b.scale))
