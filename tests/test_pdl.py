"""runtime.pdl (programmatic dependent launch of the Triton kernels) on any machine: the setting's validation
and refusals, its resolution for a device (ops/kernel_support.py), and, read from the source, that every
Triton launch of ops/ takes part. Bitwise equality on and off and the graph-edge check run on a GPU:
tests/test_pdl_gpu.py.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from conftest import TINY, TINY_PATH, run_cli
from tp_runtime.config import ConfigError, load_config
from tp_runtime.ops import (add_rms_norm, compressor_pool, fp8_gemm, gemv, indexer_topk, linear, rms_norm,
                            rms_norm_pair, rope, sparse_attention, step_index)
from tp_runtime.ops.kernel_support import pdl_unavailable, resolve_pdl

OPS = Path(__file__).resolve().parents[1] / "tp_runtime" / "ops"
CPU = torch.device("cpu")


def test_default_auto_and_the_allowed_values():
    assert load_config(TINY_PATH).runtime.pdl == "auto"
    assert load_config(TINY_PATH, ["runtime.pdl=off"]).runtime.pdl == "off"
    with pytest.raises(ConfigError, match=r"'runtime\.pdl' must be one of \['auto', 'on', 'off'\], got 'always'"):
        load_config(TINY_PATH, ["runtime.pdl=always"])


def test_on_is_refused_where_it_cannot_run():
    # YAML reads a bare `on` as a boolean: it still means "on" (and is refused here for what is missing)
    with pytest.raises(ConfigError, match=r"override 'runtime\.pdl=on'.*'runtime\.pdl'=on needs a CUDA device, "
                                          r"but runtime\.device=cpu; use runtime\.pdl=auto or off"):
        load_config(TINY_PATH, ["runtime.pdl=on", "runtime.device=cpu"])
    with pytest.raises(ConfigError, match=r"runtime\.kernels=torch'.*needs runtime\.kernels=triton or auto"):
        load_config(TINY_PATH, ["runtime.pdl=on", "runtime.kernels=torch"])
    why = pdl_unavailable("auto")  # this machine's GPUs, Triton and its interpreter setting
    if why is None:
        assert load_config(TINY_PATH, ["runtime.pdl=on"]).runtime.pdl == "on"
    else:
        with pytest.raises(ConfigError, match=r"'runtime\.pdl'=on needs " + why.split(",")[0]):
            load_config(TINY_PATH, ["runtime.pdl=on"])


def test_cli_refuses_on_before_any_rank_starts():
    proc = run_cli(["run", TINY, "runtime.pdl=on", "runtime.device=cpu", "parallel.tp=1"], timeout_s=60)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "'runtime.pdl'=on" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout.strip() == ""


def test_resolve_pdl():
    assert resolve_pdl("off", CPU) is False
    assert resolve_pdl("auto", CPU) is False  # no GPU, so no PDL, and no error
    with pytest.raises(ValueError, match=r"'runtime\.pdl'=on needs a CUDA device; this rank runs on cpu"):
        resolve_pdl("on", CPU)
    with pytest.raises(ValueError, match=r"'runtime\.pdl' must be one of"):
        resolve_pdl("sometimes", CPU)
    if torch.cuda.is_available():  # auto is on exactly where nothing is missing
        gpu = torch.device("cuda", 0)
        assert resolve_pdl("auto", gpu) is (pdl_unavailable(gpu) is None)


def _launches(tree: ast.AST, kernels: dict[str, ast.FunctionDef]) -> list[ast.Call]:
    """Calls of the form kernel[grid](...) of the file's jit kernels."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
            and getattr(n.func.value, "id", None) in kernels]


def _jit_kernels(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
            and any(getattr(d, "id", None) == "jit" for d in f.decorator_list)}


@pytest.mark.parametrize("path", sorted(p.name for p in OPS.glob("*.py")))
def test_every_triton_launch_takes_part(path):
    # Each launch passes the wrapper's pdl as launch_pdl and as the kernel's PDL constexpr, and each launched
    # kernel waits (pdl_wait) before its loads and triggers (pdl_trigger, itself or in a helper it calls).
    # Kernels and helpers are looked up in every file of ops/ (a launch may be of another file's kernel), the
    # launching file's own first.
    tree = ast.parse((OPS / path).read_text())
    kernels = {name: f for other in sorted(OPS.glob("*.py"))
               for name, f in _jit_kernels(ast.parse(other.read_text())).items()}
    kernels.update(_jit_kernels(tree))
    if path == "indexer_topk.py":  # its select launches are of ops/topk_select.py's kernels
        assert {c.func.value.id for c in _launches(tree, kernels)} >= {"split_select_kernel", "regs_select_kernel"}
    for call in _launches(tree, kernels):
        name = call.func.value.id
        kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert kw.get("launch_pdl") == "pdl" and kw.get("PDL") == "pdl", f"{path}: {name} launched without pdl"
        body = kernels[name]
        assert "PDL" in [a.arg for a in body.args.args], f"{path}: {name} has no PDL constexpr"
        calls = {getattr(n.func, "id", None) for n in ast.walk(body) if isinstance(n, ast.Call)}
        assert "pdl_wait" in calls, f"{path}: {name} never waits"
        helpers = [kernels[c] for c in calls if c in kernels]
        assert "pdl_trigger" in calls | {getattr(n.func, "id", None) for h in helpers for n in ast.walk(h)
                                          if isinstance(n, ast.Call)}, f"{path}: {name} never triggers"


WRAPPERS = [rms_norm.rms_norm, rope.prepare_heads, compressor_pool.compress_pool, indexer_topk.indexer_topk,
            sparse_attention.sparse_attention_sink, linear.linear_triton, linear.fp8_linear, fp8_gemm.fp8_gemm,
            fp8_gemm.quantize_x, step_index.step_index, add_rms_norm.add_rms_norm, rms_norm_pair.rms_norm_pair,
            gemv.gemv]


@pytest.mark.parametrize("fn", WRAPPERS, ids=lambda f: f.__name__)
def test_every_wrapper_takes_pdl_off_by_default(fn):
    p = inspect.signature(fn).parameters["pdl"]
    assert p.default is False and p.annotation in (bool, "bool")


def test_bench_lanes_name_pdl_and_streams():
    # A sweep interleaves lanes with and without PDL and the side stream in one run (configs/bench_shard_tp.yaml).
    from tp_runtime.bench.sweep_config import split_mode
    assert split_mode("full@pdl_off+streams1") == ("full", {"pdl": "off", "streams": 1})
    assert split_mode("full@pdl_on+streams2+triton") == ("full", {"pdl": "on", "streams": 2, "kernels": "triton"})
    assert split_mode("full@pdl_maybe") == ("full", None)
