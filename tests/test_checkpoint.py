"""DeepSeek-V4 checkpoints: a synthetic FP8 checkpoint of the tiny config, written by the CLI, loaded at tp = 1, 2, 4.

The writer quantizes the seeded weights (weights.draw_full) per 128x128 block; `stored_values` is what a
loader must recover. Dequantization is exact in float32 (an fp8 value times a power of two), so loaded
parameters are compared bit for bit. The tiny shapes put shard boundaries inside 128x128 blocks
(wq_b: 256 rows over 4 ranks), the general case; the memory test's wider shapes take the aligned path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tp_runtime.config import ConfigError, load_config, read_checkpoint_config
from tp_runtime.engine.driver import drive
from tp_runtime.engine.entry import in_process
from tp_runtime.executor.worker import Worker
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import TPGroup, single_process
from tp_runtime.verify.check import TOLERANCES, max_rel_err
from tp_runtime.paths import OutputError
from tp_runtime.weights import checkpoint_read as checkpoint
from tp_runtime.weights import checkpoint_write
from tp_runtime.weights.checkpoint_read import load_checkpoint, read_raw_bytes, validate_checkpoint
from tp_runtime.weights.checkpoint_write import stored_values, write_checkpoint
from tp_runtime.weights.fill import draw_full
from tp_runtime.weights.format import INDEX, CheckpointError, scale_name
from tp_runtime.ops.linear import e8m0_scales
from tp_runtime.weights.fp8 import dequantize_fp8, quantize_fp8
from tp_runtime.weights.specs import model_specs, place, shard_of
from conftest import ROOT, assert_refused, child_env, last_json, run_cli

TINY = str(ROOT / "configs" / "tiny.yaml")
CPU = torch.device("cpu")
RUN = ["runtime.device=cpu", "runtime.dtype=float32"]
# Prompts below, at and past the window (16), past the indexer's top-K (8 entries = 32 tokens) and
# past one 128-token block; 2 slots for 4 requests.
SCENARIO = ["workload.requests=4", "workload.prompt_lens=[5, 40, 140, 17]", "workload.decode_lens=[3, 2, 1, 4]",
            "runtime.max_seqs=2"]
FILE2 = "model-00002-of-00003.safetensors"  # layers 2 and 3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """The tiny config's seeded weights as a 3-file FP8 checkpoint, written through the CLI."""
    d = tmp_path_factory.mktemp("ckpt")
    proc = run_cli(["write-checkpoint", TINY, str(d), "--files", "3", *RUN], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["files"] == 3
    return d


def cfg_for(ckpt: Path, *extra: str):
    return load_config(TINY, RUN + SCENARIO + [f"model.checkpoint={ckpt}", *extra])


def expected_full(cfg) -> dict[str, torch.Tensor]:
    """Every selected tensor as the checkpoint stores it (FP8 / bf16 round trip of the seeded draw)."""
    return {s.name: stored_values(s, draw_full(s, cfg.runtime.seed, CPU)) for s in model_specs(cfg.model)}


def new_stack(cfg, rank: int = 0, size: int = 1) -> AttentionStack:
    return AttentionStack(cfg.model, TPGroup(rank=rank, size=size, device=CPU), cfg.runtime.max_len,
                          torch.float32, CPU)


# ---------------------------------------------------------------- FP8 blocks


def test_quantize_gives_power_of_two_block_scales_and_bounded_error():
    torch.manual_seed(0)
    w = torch.randn(300, 520)  # 3 x 5 blocks, the last row and column of blocks partial
    w[:128, 128:256] *= 1e-5
    w[128:256, :128] = 0.0
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8 and s.shape == (3, 5)
    assert int(s[1, 0]) == 127  # an all-zero block gets scale 1
    back = dequantize_fp8(q, s)
    for i in range(3):
        for j in range(5):
            blk, qb = (slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1)))
            amax = w[blk, qb].abs().max()
            if amax == 0:
                continue
            # The smallest power of two that keeps the block within fp8's range: amax / s in (224, 448].
            assert 224 < amax / 2.0 ** (int(s[i, j]) - 127) <= 448
            # e4m3 keeps 3 mantissa bits: rounding error <= 2^-4 of a value, so <= 2^-4 of the block max.
            assert (back[blk, qb] - w[blk, qb]).abs().max() <= amax * 2 ** -4


@pytest.mark.parametrize("r0,r1,c0,c1", [(0, 300, 0, 520), (128, 256, 256, 512), (64, 200, 100, 300),
                                         (130, 290, 129, 519)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dequantized_shard_equals_slice_of_full(r0, r1, c0, c1, dtype):
    torch.manual_seed(1)
    q, s = quantize_fp8(torch.randn(300, 520))
    # Reference: every element times 2^(byte - 127) of its block, spelled out independently.
    scale = (s.double() - 127).exp2().repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :520]
    full = q.double() * scale
    part = dequantize_fp8(q[r0:r1, c0:c1], s[r0 // 128: -(-r1 // 128), c0 // 128: -(-c1 // 128)], r0, c0, dtype)
    assert part.dtype == dtype and torch.equal(part, full[r0:r1, c0:c1].to(dtype))  # exact in all three


def test_e8m0_raw_bytes_match_torch(ckpt):
    v = torch.arange(0, 255, dtype=torch.uint8)  # every finite e8m0 value
    assert torch.equal(e8m0_scales(v), v.view(torch.float8_e8m0fnu).float())
    name, path = "layers.2.attn.wq_b.scale", ckpt / FILE2
    with safe_open(str(path), framework="pt") as f:
        via_torch = f.get_slice(name)[1:2, 0:1].contiguous().view(torch.uint8)
    assert torch.equal(read_raw_bytes(path, name, slice(1, 2), slice(0, 1)), via_torch)


def test_scales_are_read_as_raw_bytes_where_torch_lacks_e8m0(ckpt, monkeypatch):
    """torch < 2.7 has no float8_e8m0fnu: the loader then reads the scale bytes from the file itself."""
    cfg = cfg_for(ckpt, "model.layers=2-3")
    ref, raw = new_stack(cfg, 1, 4), new_stack(cfg, 1, 4)
    load_checkpoint(ref, ckpt)
    monkeypatch.setattr(checkpoint, "E8M0", None)
    load_checkpoint(raw, ckpt)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), raw.parameters()))


# ---------------------------------------------------------------- the written layout


def test_written_layout_matches_the_released_one(ckpt):
    cfg = load_config(TINY, RUN)
    weight_map = json.loads((ckpt / INDEX).read_text())["weight_map"]
    dtypes = {"ape": "F32", "sink": "F32"}
    for spec in model_specs(cfg.model):
        layer = int(spec.name.split(".")[1])
        path = ckpt / weight_map[spec.name]
        assert weight_map[spec.name] == f"model-{layer // 2 + 1:05d}-of-00003.safetensors"
        with safe_open(str(path), framework="pt") as f:
            sl = f.get_slice(spec.name)
            assert tuple(sl.get_shape()) == spec.shape
            assert sl.get_dtype() == ("F8_E4M3" if spec.fp8 else dtypes.get(spec.kind, "BF16"))
            if spec.fp8:
                assert weight_map[scale_name(spec.name)] == weight_map[spec.name]
                sc = f.get_slice(scale_name(spec.name))
                assert sc.get_dtype() == "F8_E8M0"
                assert tuple(sc.get_shape()) == tuple(-(-n // 128) for n in spec.shape)
    values, _ = read_checkpoint_config(ckpt)
    assert values["compress_ratios"] == cfg.model.compress_ratios and values["hidden_size"] == 64


# ---------------------------------------------------------------- what each rank loads


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_holds_its_slice_of_the_dequantized_tensor(ckpt, tp):
    cfg = cfg_for(ckpt)
    full = expected_full(cfg)
    for rank in range(tp):
        stack = new_stack(cfg, rank, tp)
        rep = load_checkpoint(stack, ckpt)
        for spec in model_specs(cfg.model):
            want = shard_of(spec, full[spec.name], stack.tp)
            got = stack.get_parameter(spec.param).narrow(0, spec.row_offset, want.shape[0])
            assert torch.equal(got, want), f"{spec.name} rank {rank}/{tp}"
        assert len(rep["files"]) == 3 and rep["s"] > 0 and rep["host_peak_method"] in ("vmhwm", "ru_maxrss")
        # Every rank reads the replicated tensors whole and 1/tp of the sharded ones.
        if tp == 1:
            assert rep["read_bytes"] == rep["checkpoint_bytes"]
        else:
            assert rep["read_bytes"] < rep["checkpoint_bytes"]


def test_only_the_files_of_the_selected_layers_are_opened(ckpt, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    for name in ("model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"):
        (d / name).write_bytes(b"not a safetensors file")  # any read of these would fail
    cfg = cfg_for(ckpt, "model.layers=2-3")
    stack = new_stack(cfg, 1, 2)
    assert load_checkpoint(stack, d)["files"] == [FILE2]
    spec = next(s for s in model_specs(cfg.model) if s.name == "layers.3.attn.wo_b.weight")
    assert torch.equal(stack.get_parameter(spec.param), shard_of(spec, expected_full(cfg)[spec.name], stack.tp))
    with pytest.raises(CheckpointError, match="model-00001-of-00003.safetensors.*cannot be opened"):
        load_checkpoint(new_stack(cfg_for(ckpt, "model.layers=1-2")), d)  # the damage is real


# ---------------------------------------------------------------- outputs


@pytest.fixture(scope="module")
def tp1(ckpt):
    return in_process(cfg_for(ckpt, "parallel.tp=1"), keep_outputs=True)


def test_tp1_outputs_equal_the_seeded_model_after_the_fp8_round_trip(ckpt, tp1):
    seeded = load_config(TINY, RUN + SCENARIO + ["parallel.tp=1"])
    worker = Worker(seeded, single_process(CPU))
    try:
        with torch.no_grad():
            for spec, value in zip(model_specs(seeded.model), expected_full(seeded).values()):
                place(worker.stack, spec, value)
        quantized = drive(worker, keep_outputs=True)
    finally:
        worker.close()
    # Bit-identical: the same float32 weights (dequantization is exact) through the same kernels in
    # one process, so no tolerance is needed.
    assert len(tp1.outputs) == 4 and max_rel_err(tp1.outputs, quantized.outputs) == 0.0
    # The round trip does change the model (fp8 keeps 3 mantissa bits), so the equality above can fail.
    assert max_rel_err(tp1.outputs, in_process(seeded, keep_outputs=True).outputs) > 1e-3
    assert tp1.load["tensors"] > 0 and tp1.load["checkpoint"] == str(ckpt)


@pytest.mark.parametrize("tp", [2, 4])
def test_multiprocess_run_matches_tp1(ckpt, tp1, tp, tmp_path):
    dump = tmp_path / "dump.safetensors"
    proc = run_cli(["run", TINY, f"model.checkpoint={ckpt}", f"parallel.tp={tp}", "parallel.launcher=local",
                   f"workload.dump={dump}", *RUN, *SCENARIO], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = last_json(proc.stdout)
    d = load_file(str(dump))
    outputs = {int(r): d[f"output.{j}"] for j, r in enumerate(d["request_id"])}
    # Same weights on every rank's slice; only the all-reduce's summation order differs from tp = 1
    # (float32 tolerance justified in check.py).
    assert max_rel_err(outputs, tp1.outputs) < TOLERANCES["float32"]
    assert rec["tp"] == tp and len(rec["load_files"]) == 3 and rec["load_s"] > 0
    assert 0 < rec["load_read_bytes"] < rec["load_checkpoint_bytes"] and rec["load_host_peak_bytes"] > 0


# ---------------------------------------------------------------- errors


def _rewrite(path: Path, edit) -> None:
    """Apply edit(dict of tensors) to one safetensors file, replacing the file atomically."""
    tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
    edit(tensors)
    save_file(tensors, str(path) + ".new", metadata={"format": "pt"})
    os.replace(str(path) + ".new", path)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _set(name: str, value_of):
    return lambda t: t.__setitem__(name, value_of(t[name]))


MUTATIONS = {
    "not in the index": (INDEX, lambda d: d["weight_map"].pop("layers.2.attn.wq_b.weight"),
                         ["layers.2.attn.wq_b.weight", INDEX, "names no file"]),
    "not in its file": (FILE2, lambda t: t.pop("layers.3.attn.compressor.ape"),
                        ["layers.3.attn.compressor.ape", FILE2, "missing"]),
    "wrong shape": (FILE2, _set("layers.2.attn.q_norm.weight", lambda x: x[:31].clone()),
                    ["layers.2.attn.q_norm.weight", FILE2, "[31]", "[32]"]),
    "wrong dtype": (FILE2, _set("layers.2.attn.wq_b.weight", lambda x: x.to(torch.bfloat16)),
                    ["layers.2.attn.wq_b.weight", FILE2, "BF16", "F8_E4M3"]),
    "scale of a per-tensor shape": (FILE2, _set("layers.2.attn.wq_b.scale", lambda x: x[:1, :1].clone()),
                                    ["layers.2.attn.wq_b.scale", FILE2, "[1, 1]", "[2, 1]", "128x128"]),
    "NaN scale": (FILE2, _set("layers.3.attn.wq_a.scale", lambda x: torch.full_like(x.view(torch.uint8), 255)
                              .view(torch.float8_e8m0fnu)), ["layers.3.attn.wq_a.scale", FILE2, "NaN"]),
    "config.json disagrees": ("config.json", lambda d: d.__setitem__("index_topk", 16),
                              ["model.index_topk", "config.json", "8", "16"]),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_bad_checkpoint_is_refused_naming_tensor_and_file_and_nothing_is_loaded(ckpt, tmp_path, case):
    fname, edit, words = MUTATIONS[case]
    cfg = cfg_for(ckpt, "model.layers=2-3")  # merged from the intact config.json
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    (_edit_json if fname.endswith(".json") else _rewrite)(d / fname, edit)
    stack = new_stack(cfg, 1, 2)
    for p in stack.parameters():
        p.data.fill_(7.0)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(stack, d)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert all(bool((p == 7.0).all()) for p in stack.parameters())  # checks come before any copy
    with pytest.raises(CheckpointError) as e1:
        validate_checkpoint(cfg.model, d)  # the check the CLI makes before starting ranks
    assert str(e1.value) == msg


def test_cli_refuses_a_bad_checkpoint_before_starting_ranks(ckpt, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    _rewrite(d / FILE2, _set("layers.2.attn.wq_b.weight", lambda x: x.to(torch.bfloat16)))
    proc = run_cli(["run", TINY, f"model.checkpoint={d}", "parallel.tp=2", *RUN], timeout_s=300)
    # The CLI's own refusal (exit 2, the error first), not a rank's failure ("error: rank 0 failed ...").
    assert proc.returncode == 2 and proc.stderr.startswith("error: FP8 tensor layers.2.attn.wq_b.weight in ")
    assert FILE2 in proc.stderr and "BF16" in proc.stderr


def _point(tensor: str, to) -> callable:
    """An index edit: tensor's entry (and its scale's) names the file to(d), d the checkpoint's folder."""
    def edit(index: dict, d: Path) -> None:
        for name in (tensor, scale_name(tensor)):
            index["weight_map"][name] = to(d)
    return edit


ESCAPES = {
    "parent": lambda d: f"../{d.name}/{FILE2}",  # the very file, reached from outside the folder
    "absolute": lambda d: str(d / FILE2),
    "inside, then out": lambda d: f"sub/../../{d.name}/{FILE2}",
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_index_entries_outside_the_checkpoint_folder_are_refused_naming_the_entry(ckpt, tmp_path, case):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    index = json.loads((d / INDEX).read_text())
    _point("layers.2.attn.wq_b.weight", ESCAPES[case])(index, d)
    (d / INDEX).write_text(json.dumps(index))
    cfg = cfg_for(ckpt, "model.layers=2-3")
    with pytest.raises(CheckpointError, match=r"entry 'layers\.2\.attn\.wq_b\.(weight|scale)' -> .* names a file "
                                              r"outside the checkpoint directory"):
        validate_checkpoint(cfg.model, d)


def test_symlinks_the_checkpoint_folder_holds_are_followed(ckpt, tmp_path):
    """A Hugging Face cache snapshot links every file to ../../blobs/<hash>: such a folder still loads."""
    (tmp_path / "blobs").mkdir()
    d = tmp_path / "snapshots" / "rev"
    d.mkdir(parents=True)
    for f in ckpt.iterdir():
        shutil.copy(f, tmp_path / "blobs" / f.name)
        (d / f.name).symlink_to(Path("..", "..", "blobs", f.name))
    validate_checkpoint(cfg_for(ckpt).model, d)


@pytest.mark.parametrize("name", ["config.json", INDEX, FILE2])
def test_a_checkpoint_file_that_is_a_directory_is_refused_in_one_line(ckpt, tmp_path, name):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    (d / name).unlink()
    (d / name).mkdir()
    with pytest.raises(CheckpointError, match=f"{d / name} is not a regular file"):
        validate_checkpoint(cfg_for(ckpt).model, d)
    if name == "config.json":  # the run's config is read first: the CLI's one line, not a traceback
        assert_refused(run_cli(["run", TINY, f"model.checkpoint={d}", *RUN], timeout_s=300), d / name)


# ---------------------------------------------------------------- non-finite data (headers cannot show it)


def _bytes_at(value: int, row: int = 0, col: int = 3):
    """An FP8 tensor with one raw byte set (0x7F and 0xFF are e4m3fn's NaN encodings)."""
    def edit(x):
        raw = x.view(torch.uint8).clone()
        raw[row, col] = value
        return raw.view(torch.float8_e4m3fn)
    return edit


def _random_bytes(x):
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (x.numel() * x.element_size(),), generator=g, dtype=torch.uint8)
    return raw.view(x.dtype).view(x.shape)


NONFINITE = {  # case -> (tensor, edit); rows and columns inside rank 0's shard (loaded as rank 0 of 2)
    "NaN in a bf16 norm": ("layers.2.attn_norm.weight", lambda x: x.index_fill(0, torch.tensor([5]), float("nan"))),
    "inf in an fp32 ape": ("layers.3.attn.compressor.ape", lambda x: x.index_fill(1, torch.tensor([1]), float("inf"))),
    "e4m3 NaN byte 0x7F": ("layers.2.attn.wq_b.weight", _bytes_at(0x7F)),
    "e4m3 NaN byte 0xFF": ("layers.3.attn.wo_b.weight", _bytes_at(0xFF, row=7, col=1)),
    "random bytes in an FP8 data area": ("layers.2.attn.wq_a.weight", _random_bytes),
    "random bytes in a bf16 data area": ("layers.3.attn.compressor.wkv.weight", _random_bytes),
}


@pytest.mark.parametrize("case", list(NONFINITE))
def test_non_finite_weights_are_refused_naming_tensor_and_file(ckpt, tmp_path, case):
    tensor, edit = NONFINITE[case]
    cfg = cfg_for(ckpt, "model.layers=2-3")
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    _rewrite(d / FILE2, _set(tensor, edit))
    validate_checkpoint(cfg.model, d)  # the headers are fine: only the values are not
    with pytest.raises(CheckpointError, match="holds non-finite values") as e:
        load_checkpoint(new_stack(cfg, 0, 2), d)
    assert str(e.value).startswith(f"tensor {tensor} from {d / FILE2} "), e.value


def test_run_refuses_a_nan_checkpoint_and_check_fails(ckpt, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    _rewrite(d / FILE2, _set(*NONFINITE["NaN in a bf16 norm"]))
    # tp = 2: the rank that loads the tensor refuses it; the launcher names that rank and the cause.
    proc = run_cli(["run", TINY, f"model.checkpoint={d}", "parallel.tp=2", "parallel.launcher=local", *RUN],
                   timeout_s=300)
    assert proc.returncode == 1 and "output_checksum" not in proc.stdout, proc.stdout[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: rank ") and f"tensor layers.2.attn_norm.weight from {d / FILE2}" in err, err
    proc = run_cli(["check", TINY, f"model.checkpoint={d}", "parallel.tp=1", "parallel.launcher=local", *RUN],
                   timeout_s=300)
    assert proc.returncode == 1 and "layers.2.attn_norm.weight" in proc.stderr, proc.stderr[-2000:]


def test_outputs_that_overflow_fail_run_and_check_with_strict_json(ckpt, tmp_path):
    # Finite weights that overflow float32 in the first GEMM (3e38 x the normalized input, summed):
    # the load accepts them, the outputs turn inf/NaN at the first token of every request.
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    _rewrite(d / "model-00001-of-00003.safetensors",
             _set("layers.0.attn_norm.weight", lambda x: torch.full_like(x, 3e38)))
    one = ["parallel.tp=1", "parallel.launcher=local"]
    proc = run_cli(["run", TINY, f"model.checkpoint={d}", *one, *RUN], timeout_s=300)
    rec = last_json(proc.stdout)  # strict: a bare NaN would not parse
    assert proc.returncode == 1 and rec["output_checksum"] is None and rec["output_checksum_finite"] is False
    assert proc.stderr.strip().splitlines()[-1] == ("error: the outputs turned non-finite (NaN or inf; "
                                                    "output_checksum is null)"), proc.stderr[-2000:]
    proc = run_cli(["check", TINY, f"model.checkpoint={d}", *one, *RUN], timeout_s=300)
    rec = last_json(proc.stdout)
    assert proc.returncode == 1 and rec["ok"] is False
    c = rec["comparisons"]["tp_vs_tp1"]
    assert c["ok"] is False and c["max_rel_err"] is None and c["nonfinite"] == "tp=1 local: request 0 position 0"


def test_write_into_a_reused_directory_removes_its_old_shards_only(tmp_path):
    cfg = load_config(TINY, RUN)
    write_checkpoint(cfg, tmp_path, 3)
    (tmp_path / "notes.txt").write_text("mine")
    rec = write_checkpoint(cfg, tmp_path, 2)
    assert rec["removed"] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted([
        "config.json", INDEX, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "notes.txt"])
    validate_checkpoint(load_config(TINY, RUN + [f"model.checkpoint={tmp_path}"]).model, tmp_path)


# ---------------------------------------------------------------- written whole


def _files(d: Path) -> dict[str, bytes]:
    """Every file under d (relative name -> bytes)."""
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def _beside(d: Path) -> list[str]:
    """What a write leaves beside folder d in its parent: its lock, new or swapped-out folder."""
    return sorted(f.name for f in d.parent.iterdir() if f.name.startswith(f".{d.name}."))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_rewrite_leaves_the_old_checkpoint_whole(tmp_path, sig):
    d = tmp_path / "ck"
    write_checkpoint(load_config(TINY, RUN), d, 6)
    (d / "notes.txt").write_text("mine")
    before = _files(d)
    # A rewrite with other weights (seed 1), stopped once its first shard is written (of 6, ~1 s apart here).
    proc = subprocess.Popen([sys.executable, "-m", "tp_runtime.cli", "write-checkpoint", TINY, str(d), "--files", "6",
                             *RUN, "runtime.seed=1"], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = tmp_path / ".ck.new" / "model-00001-of-00006.safetensors"
        deadline = time.monotonic() + 120
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err[-3000:]
    assert _files(d) == before  # every file as it was: no new shard beside old ones
    if sig == signal.SIGINT:
        assert "Traceback" not in err and err.strip().splitlines() == ["error: interrupted (SIGINT)"], err
        assert _beside(d) == []  # the unfinished folder and the lock are removed on the way out
    else:  # a crash leaves the unfinished folder; the next write removes it and says so
        assert ".ck.new" in _beside(d)
        rec = write_checkpoint(load_config(TINY, RUN + ["runtime.seed=1"]), d, 6)
        assert any(".ck.new" in n and "unfinished" in n for n in rec["notes"]), rec["notes"]
        assert _beside(d) == [] and (d / "notes.txt").read_text() == "mine"
    validate_checkpoint(load_config(TINY, RUN + [f"model.checkpoint={d}"]).model, d)


def test_a_crash_between_the_swap_renames_is_named_by_a_load_and_undone_by_the_next_write(tmp_path):
    d = tmp_path / "ck"
    write_checkpoint(load_config(TINY, RUN), d, 3)
    before = _files(d)
    # The state a crash between the two renames leaves: the old folder aside, the new one whole beside it.
    d.rename(tmp_path / ".ck.old")
    (tmp_path / ".ck.new").mkdir()
    (tmp_path / ".ck.new" / "model-00001-of-00003.safetensors").write_bytes(b"new")
    with pytest.raises(ConfigError, match=r"is not a directory.*\.ck\.old holds the checkpoint a write-checkpoint "
                                          r"was replacing"):
        load_config(TINY, RUN + [f"model.checkpoint={d}"])
    rec = write_checkpoint(load_config(TINY, RUN + ["runtime.seed=2"]), d, 3)
    assert any(n.startswith(f"restored {d} from ") for n in rec["notes"]), rec["notes"]
    assert _beside(d) == [] and _files(d).keys() == before.keys() and _files(d) != before  # restored, then rewritten


def test_a_second_writer_into_the_same_folder_is_refused_at_once(tmp_path, monkeypatch):
    d = tmp_path / "ck"
    write_checkpoint(load_config(TINY, RUN), d, 3)
    wrote_one, go_on = threading.Event(), threading.Event()
    save = checkpoint_write.save_file

    def paused_save(*args, **kwargs):  # the first writer stops after its first shard until told to go on
        save(*args, **kwargs)
        wrote_one.set()
        assert go_on.wait(120)

    monkeypatch.setattr(checkpoint_write, "save_file", paused_save)
    first: dict = {}
    writer = threading.Thread(target=lambda: first.update(write_checkpoint(load_config(TINY, RUN), d, 2)))
    writer.start()
    try:
        assert wrote_one.wait(120)
        with pytest.raises(OutputError, match=f"OUT_DIR={d}: another write-checkpoint is writing {d} now"):
            write_checkpoint(load_config(TINY, RUN + ["runtime.seed=1"]), d, 3)
        proc = run_cli(["write-checkpoint", TINY, str(d), "--files", "3", *RUN], timeout_s=300)
        assert_refused(proc, str(d), "another write-checkpoint is writing")
    finally:
        go_on.set()
        writer.join(120)
    assert first["removed"] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    index = json.loads((d / INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(f.name for f in d.glob("model-*.safetensors"))
    validate_checkpoint(load_config(TINY, RUN + [f"model.checkpoint={d}"]).model, d)
    assert _beside(d) == []


# ---------------------------------------------------------------- config merge


def test_config_json_supplies_the_model_section(ckpt, tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text(f"model:\n  checkpoint: {ckpt}\n  layers: 1-4\nparallel:\n  tp: 2\n")
    cfg = load_config(y, RUN)
    tiny = load_config(TINY).model
    assert (cfg.model.hidden_size, cfg.model.compress_ratios, cfg.model.index_topk) == \
        (tiny.hidden_size, tiny.compress_ratios, tiny.index_topk)
    assert cfg.model.layer_ids() == [1, 2, 3, 4] and cfg.parallel.tp == 2


def test_yaml_model_value_that_disagrees_names_key_values_and_both_files(ckpt, tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text(Path(TINY).read_text().replace("index_topk: 8", "index_topk: 16"))
    with pytest.raises(ConfigError) as e:
        load_config(y, [f"model.checkpoint={ckpt}"])
    msg = str(e.value)
    assert all(w in msg for w in ("model.index_topk", str(y), "16", str(ckpt / "config.json"), "has 8")), msg
    with pytest.raises(ConfigError, match=r"override 'model\.num_hidden_layers=4'.*has 6.*model\.layers"):
        load_config(TINY, [f"model.checkpoint={ckpt}", "model.num_hidden_layers=4"])


def test_layer_range_outside_the_checkpoint_is_refused(ckpt):
    with pytest.raises(ConfigError,
                       match=r"model\.layers='4-7' selects \[6, 7\].*config\.json has num_hidden_layers=6"):
        load_config(TINY, [f"model.checkpoint={ckpt}", "model.layers=4-7"])


# ---------------------------------------------------------------- host memory


MEMORY_PROBE = """
import json, sys, torch
from tp_runtime.config import load_config
from tp_runtime.model.stack import AttentionStack
from tp_runtime.parallel.group import TPGroup
from tp_runtime.weights.checkpoint_read import load_checkpoint
cfg = load_config(sys.argv[1], ["model.checkpoint=" + sys.argv[2]])
tp = TPGroup(rank=0, size=int(sys.argv[3]), device=torch.device("cpu"))
stack = AttentionStack(cfg.model, tp, cfg.runtime.max_len, torch.float32, torch.device("cpu"))
print(json.dumps(load_checkpoint(stack, sys.argv[2])))
"""

WIDE = """model: {hidden_size: 512, num_hidden_layers: 4, num_attention_heads: 16, head_dim: 256, qk_rope_head_dim: 64,
  q_lora_rank: 512, o_groups: 4, o_lora_rank: 1024, index_n_heads: 4, index_head_dim: 64,
  compress_ratios: [0, 0, 0, 0, 0]}
runtime: {max_len: 64}
"""


def test_host_memory_of_a_rank_follows_its_shard(tmp_path):
    y = tmp_path / "wide.yaml"
    y.write_text(WIDE)  # 4 layers of 8.4M weights each; the sharded wq_b, wo_a, wo_b hold 95% of them
    write_checkpoint(load_config(y), tmp_path / "ck", n_files=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = {tp: subprocess.Popen([sys.executable, "-c", MEMORY_PROBE, str(y), str(tmp_path / "ck"), str(tp)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tp in (1, 4)}  # fresh processes: no freed memory to reuse, so growth shows
    rep = {}
    for tp, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        rep[tp] = json.loads(out.strip().splitlines()[-1])
    # On CPU the parameters are host memory, so the measure must see the whole model (134 MiB float32)
    # filled at tp = 1. Measured here: tp = 1 peaks near 196 MiB, tp = 4 near 67 MiB (its 38 MiB of
    # parameters, the pages of its slices, one tensor's temporaries); half of tp = 1 leaves room for
    # allocator noise while a rank that read or kept whole tensors would exceed it.
    assert rep[1]["host_peak_bytes"] >= rep[1]["param_bytes"]
    assert rep[4]["host_peak_bytes"] < 0.5 * rep[1]["host_peak_bytes"]
    assert rep[4]["read_bytes"] < 0.35 * rep[1]["read_bytes"]


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_load_is_exact_in_bf16_and_runs_at_tp2(ckpt, tmp_path):
    cfg = cfg_for(ckpt, "runtime.device=cuda", "runtime.dtype=bfloat16")
    dev = torch.device("cuda", 0)
    stack = AttentionStack(cfg.model, single_process(dev), cfg.runtime.max_len, torch.bfloat16, dev)
    rep = load_checkpoint(stack, ckpt)
    for spec, value in zip(model_specs(cfg.model), expected_full(cfg).values()):
        got = stack.get_parameter(spec.param).narrow(0, spec.row_offset, value.shape[0])
        # fp8 times a power of two is exact in bf16; bf16 tensors are loaded as stored.
        assert torch.equal(got.cpu(), value.to(got.dtype)), spec.name
    assert rep["s"] > 0
    if torch.cuda.device_count() >= 2:
        proc = run_cli(["check", TINY, f"model.checkpoint={ckpt}", "parallel.tp=2", "parallel.launcher=local",
                        "runtime.device=cuda", *SCENARIO], timeout_s=300)
        assert proc.returncode == 0 and last_json(proc.stdout)["ok"], proc.stdout[-3000:] + proc.stderr[-3000:]
