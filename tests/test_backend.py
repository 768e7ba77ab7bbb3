"""The kernel backend (ops/select.py): one object chosen once, reaching every layer, on the CPU.

- both backends offer the methods of KernelBackend with the same parameters;
- select_backend keeps runtime.kernels' resolution and errors, and carries pdl to the Triton backend only;
- the stack hands one backend object to every module that launches kernels, and no model module
  branches on the backend's name;
- the torch backend's stack (every break scope) gives, bit for bit, what the torch twins composed by
  hand give: the layers route each kernel call to the twin with the same arguments, in the same order;
- runtime.indexer_q reaches every Indexer and, as q_fp8, every indexer_topk call of its backend;
- runtime.streams is checked, a CPU runs one stream, and stage B's two-stream schedule (its code path run
  in program order) gives the one-stream values bit for bit. On a GPU: tests/test_full_graph_gpu.py.
The Triton backend's kernels against the torch twins: tests/test_prep_kernels_gpu.py and the other
GPU-marked kernel tests.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from conftest import FP8_DIMS, TINY_PATH as TINY
from tp_runtime.config import ConfigError, load_config
from tp_runtime.engine.entry import in_process
from tp_runtime.executor.plan import SeqChunk, StepPlan
from tp_runtime.executor.shard import ModelShard
from tp_runtime.model.batch import LiveBatch
from tp_runtime.model.indexer import Indexer
from tp_runtime.model.stack import AttentionStack
from tp_runtime.model.streams import INLINE, Inline
from tp_runtime.ops import select, torch_path as tp
from tp_runtime.ops.index import ring_length
from tp_runtime.ops.select import KernelBackend, select_backend
from tp_runtime.ops.torch_path import TorchBackend
from tp_runtime.ops.triton_path import TritonBackend
from tp_runtime.parallel.group import single_process
from tp_runtime.weights.fill import init_seeded

CPU = torch.device("cpu")
METHODS = [n for n, v in vars(KernelBackend).items() if inspect.isfunction(v) and not n.startswith("_")]


def test_backends_offer_the_same_methods():
    assert {"rms_norm", "heads", "rotary", "compress", "indexer_topk", "sparse_attention", "fp8_linear"} <= set(METHODS)
    for name in METHODS:
        want = list(inspect.signature(getattr(KernelBackend, name)).parameters)[1:]  # without self
        for backend in (TorchBackend(), TritonBackend()):
            assert list(inspect.signature(getattr(backend, name)).parameters) == want, (backend.name, name)
    assert (TorchBackend().name, TritonBackend().name) == ("torch", "triton")


def test_select_backend_resolves_once(monkeypatch):
    assert isinstance(select_backend("auto", CPU, torch.float32), TorchBackend)
    assert isinstance(select_backend("torch", CPU, torch.float64, pdl=True), TorchBackend)
    assert select_backend("torch", CPU, torch.float32).pdl is False  # torch launches nothing to chain
    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton needs a CUDA device"):
        select_backend("triton", CPU, torch.float32)
    with pytest.raises(ConfigError, match=r"'runtime\.kernels' must be one of"):
        select_backend("cuda", CPU, torch.float32)
    # Where Triton can run (stood in for here: resolving builds nothing on the device), the flag is carried.
    monkeypatch.setattr(select, "triton_unavailable", lambda device: None)
    cuda = torch.device("cuda")
    assert select_backend("auto", cuda, torch.bfloat16, pdl=True) == TritonBackend(pdl=True)
    assert select_backend("triton", cuda, torch.float32) == TritonBackend(pdl=False)
    assert isinstance(select_backend("auto", cuda, torch.float64), TorchBackend)  # no float64 kernels
    # The one place the launch option reaches the wrappers: nothing when off (wrappers without the keyword).
    assert TritonBackend()._kw() == {} and TritonBackend(pdl=True)._kw() == {"pdl": True}


@pytest.mark.parametrize("backend", [TorchBackend(), TritonBackend()], ids=["torch", "triton"])
def test_one_backend_object_reaches_every_layer(backend):
    # Building needs no GPU: a Triton backend launches nothing until a method runs.
    cfg = load_config(TINY).model
    stack = AttentionStack(cfg, single_process(CPU), 64, torch.float32, CPU, backend, fp8=False)
    holders = [m for m in stack.modules() if hasattr(m, "backend")]
    kinds = {type(m).__name__ for m in holders}
    assert {"RMSNorm", "ReplicatedLinear", "ColumnParallelLinear", "RowParallelLinear", "Compressor", "Indexer",
            "DSV4Attention"} <= kinds
    assert all(m.backend is backend for m in holders) and stack.kernels == backend.name
    assert {blk.attn.ratio for blk in stack.layers.values()} == {0, 4, 128}


def test_indexer_q_reaches_every_indexer_and_its_backend_call(monkeypatch):
    # runtime.indexer_q: carried by the shard to every Indexer, which passes it to the backend's indexer_topk
    # as q_fp8 on every call (tiny: layers 1 and 3 have ratio 4).
    seen = []
    twin = tp.indexer_topk

    def spy(*args, q_fp8=False, key_scales=None):
        seen.append(q_fp8)
        return twin(*args, q_fp8=q_fp8, key_scales=key_scales)

    monkeypatch.setattr(TorchBackend, "indexer_topk", staticmethod(spy))
    for setting, want in (("bf16", False), ("e4m3", True)):
        cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "parallel.launcher=local",
                                 "workload.requests=2", f"runtime.indexer_q={setting}"])
        shard = ModelShard.build(cfg, single_process(CPU))
        assert [m.q_fp8 for m in shard.stack.modules() if isinstance(m, Indexer)] == [want, want]
        seen.clear()
        in_process(cfg)
        assert seen and set(seen) == {want}


def test_no_model_module_branches_on_the_kernel_name():
    model = Path(tp.__file__).resolve().parents[1] / "model"
    for path in model.glob("*.py"):
        src = path.read_text()
        assert '"triton"' not in src and "kernels ==" not in src and ".name ==" not in src, path.name


# ------------------------------------------------------------------ the torch backend against its twins


def _twins_layer(attn, x, b, cache, out):
    """One layer with every stage-B kernel called on the torch twins directly (the composition the
    layers ran before the backend object): x [T, hidden] normed -> [T, hidden]."""
    a, n, r = attn.stage_a(x), b.n_tokens, attn.ratio
    cis = b.ix.cis[attn.rope_kind]
    q = attn.wq_b(a.qr).view(len(x), attn.n_local_heads, attn.D)
    idx = attn.indexer
    idx_q = idx.wq_b(a.qr).view(len(x), idx.n_heads, idx.head_dim) if idx else None
    q, kv, idx_q = tp.heads(q, a.kv, cis, attn.eps, cache.window.dtype, idx_q)
    if r:
        c = attn.compressor
        tp.compress_pool(a.comp_kv, a.comp_score, c.ape, c.norm.weight, c.norm.eps, b.ix.blocks[r],
                         b.ix.rings[ring_length(r)], cache.comp_state, cache.compressed)
    picks = None
    if idx:
        c = idx.compressor
        tp.compress_pool(a.idx_kv, a.idx_score, c.ape, c.norm.weight, c.norm.eps, b.ix.blocks[4], b.ix.rings[8],
                         cache.index_state, cache.index_keys, scales=cache.index_scales)
        picks = tp.indexer_topk(idx_q[:n], a.idx_w[:n], cache.index_keys, b.slot[:n], b.ix.blocks[4].n_done[:n],
                                (b.max_pos + 1) // 4, idx.topk, key_scales=cache.index_scales)
    n_comp = picks.shape[1] if picks is not None else ((b.max_pos + 1) // r if r else 0)
    tp.sparse_attention_sink(q[:n], kv, cache.window, b.ix.rings[attn.W].tokens(0, n), cache.compressed, b.slot[:n],
                             picks, b.ix.blocks[r].n_done[:n] if r else None, n_comp, attn.attn_sink, attn.scale,
                             cis[:n], out[:n])
    out[n:].zero_()
    tp.write_ring(cache.window, kv, b.ix.rings[attn.W])
    return attn.stage_c(out)


def _twins_stack(stack, x, b, caches, out):
    h = x
    for blk, cache in zip(stack.layers.values(), caches):
        h = h + _twins_layer(blk.attn, tp.rms_norm(h, blk.attn_norm.weight, blk.attn_norm.eps), b, cache,
                             out[: len(h)])
    return h


# Two prefill chunks crossing the 4- and 16-token edges and past the indexer's top-K, then a decode step.
STEPS = [StepPlan((SeqChunk(0, 0, 0, 41, False), SeqChunk(1, 1, 0, 19, False))),
         StepPlan((SeqChunk(0, 0, 41, 1, True), SeqChunk(1, 1, 19, 1, True)))]


@pytest.mark.parametrize("scope", [None, "hoisted", "narrow"])
def test_torch_backend_stack_equals_its_twins_bit_for_bit(scope):
    cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=128", "runtime.max_seqs=2"])
    shard = ModelShard.build(cfg, single_process(CPU))
    assert isinstance(shard.stack.backend, TorchBackend)
    twin_caches = shard.stack.allocate_caches(cfg.runtime.max_seqs, cfg.runtime.max_len)
    g = torch.Generator().manual_seed(0)
    live = LiveBatch()
    with torch.no_grad():
        for plan in STEPS:
            x = torch.randn(plan.n_tokens, cfg.model.hidden_size, generator=g)
            live.batch = b = shard.buffers.load(plan, x, plan.n_tokens + 3)  # 3 padding rows
            got = shard.stack(b.x, live, shard.caches, shard.attn_out, scope)
            want = _twins_stack(shard.stack, b.x, b, twin_caches, torch.zeros_like(shard.attn_out))
            assert torch.equal(got, want), (plan, scope, float((got - want).abs().max()))
    for mine, twin in zip(shard.caches, twin_caches):  # and the caches they left
        assert torch.equal(mine.window, twin.window)
        assert mine.compressed is None or torch.equal(mine.compressed, twin.compressed)
        assert mine.index_keys is None or torch.equal(mine.index_keys, twin.index_keys)


# ------------------------------------------------------------------ stage B's streams (runtime.streams)


class _OverlapInPlace(Inline):
    """The two-stream schedule's code path run in program order on the CPU (SideStream needs CUDA): the
    indexer query roped on its own, apart from the heads launch."""

    overlaps = True


def test_streams_setting_is_checked_and_a_cpu_runs_one():
    assert load_config(TINY).runtime.streams == 2
    assert load_config(TINY, ["runtime.streams=1"]).runtime.streams == 1
    with pytest.raises(ConfigError, match=r"'runtime\.streams' must be one of \[1, 2\], got 3"):
        load_config(TINY, ["runtime.streams=3"])
    stack = AttentionStack(load_config(TINY).model, single_process(CPU), 64, torch.float32, CPU, streams=2)
    assert stack.side is None and stack.streams == 1
    assert all(blk.attn.side is INLINE for blk in stack.layers.values())


def _assert_stacks_equal(a: ModelShard, b: ModelShard, g: torch.Generator) -> None:
    """Both shards' stacks run every plan of STEPS on the same hidden states drawn from g: equal bit for bit."""
    with torch.no_grad():
        for plan in STEPS:
            x = torch.randn(plan.n_tokens, a.cfg.model.hidden_size, generator=g)
            outs = []
            for shard in (a, b):
                shard.live.batch = batch = shard.buffers.load(plan, x, plan.n_tokens + 2)
                outs.append(shard.stack(batch.x, shard.live, shard.caches, shard.attn_out, None))
            assert torch.equal(*outs), plan


def test_two_stream_schedule_gives_the_one_stream_values_bit_for_bit():
    cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=128", "runtime.max_seqs=2"])
    one, two = (ModelShard.build(cfg, single_process(CPU)) for _ in range(2))
    for blk in two.stack.layers.values():
        if blk.attn.ratio:
            blk.attn.side = _OverlapInPlace()
    _assert_stacks_equal(one, two, torch.Generator().manual_seed(1))


class _NoSideTorch(TorchBackend):
    """The torch backend, as if its GEMMs shared state across streams: every GEMM of x stays in stage A."""

    @staticmethod
    def linear_stream_safe(m: int, n: int, k: int) -> bool:
        return False


def test_fp8_layers_side_branch_gemm_of_x_gives_the_stage_a_values_bit_for_bit():
    # With FP8 weights the compressors' and the indexer's projections of x (bf16 in the checkpoint) are a GEMM of
    # their own, which no product of the main branch reads: stage A leaves it to `compress`, on the side branch.
    # The stacks' outputs (and so the compressed entries, indexer keys and picks) must not move against a stack
    # that runs that GEMM in stage A; a field of StageA left unfilled on either path would raise or differ.
    cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=128", "runtime.max_seqs=2",
                             *FP8_DIMS])
    side, inline = (ModelShard.build(cfg, single_process(CPU)) for _ in range(2))
    for shard in (side, inline):
        shard.stack = AttentionStack(cfg.model, single_process(CPU), cfg.runtime.max_len, torch.float32, CPU,
                                     fp8=True)
        init_seeded(shard.stack, 0)
        for blk in shard.stack.layers.values():
            blk.attn.side = _OverlapInPlace() if blk.attn.ratio else INLINE
            blk.attn.backend = TorchBackend() if shard is side else _NoSideTorch()
    for blk, other in zip(side.stack.layers.values(), inline.stack.layers.values()):
        assert blk.attn.side_gemms(3) == (["wx"] if blk.attn.ratio else []) and not other.attn.side_gemms(3)
        a = blk.attn.stage_a(torch.randn(3, cfg.model.hidden_size))
        assert (a.side_x is not None) == bool(blk.attn.ratio) and a.comp_kv is None and a.idx_w is None
    _assert_stacks_equal(side, inline, torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ q_norm as the GEMMs' prologue


class _PrologueTorch(TorchBackend):
    """The torch backend, asked to put q_norm into the prologue of every GEMM that reads qr (the Triton
    backend does so at the shapes of ops/gemv.py's norm table)."""

    @staticmethod
    def norm_prologue(m: int, shapes: list[tuple[int, int]]) -> bool:
        return True


def test_q_norm_in_the_gemms_prologue_gives_the_separate_norms_values_bit_for_bit():
    # Each GEMM reading qr (wq_b, the indexer's wq_b) norms it as it reads; on the torch path that is the same
    # rms_norm then matmul, so the values must not move. Catches a reader left without the norm.
    cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=128", "runtime.max_seqs=2"])
    plain, fused = (ModelShard.build(cfg, single_process(CPU)) for _ in range(2))
    for blk in fused.stack.layers.values():
        blk.attn.backend = _PrologueTorch()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        x0 = torch.randn(3, cfg.model.hidden_size, generator=g)
        for blk in fused.stack.layers.values():
            assert blk.attn.stage_a(x0).qr_norm is blk.attn.q_norm
    _assert_stacks_equal(plain, fused, g)


def test_decode_batch_stores_the_window_row_in_the_heads_call_with_the_same_values():
    # A static decode step (StepBatch.decode: one token per sequence) stores each token's kv row into the
    # window ring in the heads call, before the attention, instead of after it: outputs and every cache bit
    # for bit as the store after the attention gives. Two sequences past the window (their ring rows are
    # overwritten) decode three steps each, one shard per way.
    cfg = load_config(TINY, ["runtime.device=cpu", "parallel.tp=1", "runtime.max_len=128", "runtime.max_seqs=2"])
    shards = [ModelShard.build(cfg, single_process(CPU)) for _ in range(2)]
    g = torch.Generator().manual_seed(3)
    prefill = StepPlan((SeqChunk(0, 0, 0, 41, False), SeqChunk(1, 1, 0, 19, False)))
    plans = [prefill] + [StepPlan((SeqChunk(0, 0, 41 + i, 1, True), SeqChunk(1, 1, 19 + i, 1, True)))
                         for i in range(3)]
    with torch.no_grad():
        for plan in plans:
            x = torch.randn(plan.n_tokens, cfg.model.hidden_size, generator=g)
            outs = []
            for decode, shard in zip((False, True), shards):
                shard.buffers.load(plan, x, plan.n_tokens)
                b = shard.buffers.view(plan.n_tokens, plan.n_tokens, max(c.start for c in plan.chunks),
                                       decode=decode and plan.decode_only)
                live = LiveBatch()
                live.batch = b
                outs.append(shard.stack(b.x, live, shard.caches, shard.attn_out, None).clone())
            assert torch.equal(*outs), plan
    for a, b in zip(*(s.caches for s in shards)):
        assert torch.equal(a.window, b.window)
        assert a.compressed is None or torch.equal(a.compressed, b.compressed)
