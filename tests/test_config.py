"""Configuration: YAML + overrides into typed dataclasses; every refusal names key, source, allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tp_runtime.config import ConfigError, load_config, parse_layer_spec
from conftest import TINY_PATH as TINY, ROOT, run_cli


def test_tiny_loads_with_released_key_names():
    cfg = load_config(TINY)
    m = cfg.model
    assert (m.hidden_size, m.num_attention_heads, m.head_dim, m.qk_rope_head_dim) == (64, 8, 32, 8)
    assert m.nope_head_dim == 24
    assert {0, 4, 128} <= set(m.compress_ratios[: m.num_hidden_layers])


@pytest.mark.parametrize("name,heads,groups", [("v4_flash", 64, 8), ("v4_pro", 128, 16)])
def test_released_configs(name, heads, groups):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.model.num_attention_heads == heads and cfg.model.o_groups == groups
    assert len(cfg.model.compress_ratios) == cfg.model.num_hidden_layers + 1  # + the MTP layer


def test_overrides_are_typed():
    cfg = load_config(TINY, ["parallel.tp=4", "workload.requests=16", "workload.prompt_len=[3, 9]",
                             "model.layers=1-3"])
    assert cfg.parallel.tp == 4 and cfg.workload.requests == 16
    assert cfg.workload.prompt_len == [3, 9]
    assert cfg.model.layer_ids() == [1, 2, 3]


def test_unknown_key_names_key_file_and_allowed(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  hidden_sizes: 64\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "model.hidden_sizes" in msg and str(p) in msg and "hidden_size" in msg


def test_unknown_override_names_the_word():
    with pytest.raises(ConfigError, match=r"override 'runtime\.max_lenn=3'.*unknown key 'runtime\.max_lenn'"):
        load_config(TINY, ["runtime.max_lenn=3"])


def test_wrong_type_is_refused():
    with pytest.raises(ConfigError, match=r"'parallel\.tp' must be int, got str"):
        load_config(TINY, ["parallel.tp=four"])
    with pytest.raises(ConfigError, match=r"'workload\.prompt_len' must be a list of int"):
        load_config(TINY, ["workload.prompt_len=5"])


def test_choice_is_refused_with_allowed_values():
    with pytest.raises(ConfigError,
                       match=r"'graph\.mode' must be one of \['eager', 'breakable', 'full', 'full_and_breakable'\]"):
        load_config(TINY, ["graph.mode=fast"])


def test_indexer_q_defaults_to_bf16_and_a_bad_value_is_one_error_line():
    assert load_config(TINY).runtime.indexer_q == "bf16"
    assert load_config(TINY, ["runtime.indexer_q=e4m3"]).runtime.indexer_q == "e4m3"
    with pytest.raises(ConfigError, match=r"'runtime\.indexer_q' must be one of \['bf16', 'e4m3'\], got 'fp8'"):
        load_config(TINY, ["runtime.indexer_q=fp8"])
    proc = run_cli(["run", TINY, "runtime.indexer_q=fp8"], timeout_s=60)  # refused before any rank starts
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "indexer_q" in lines[0]


@pytest.mark.parametrize("tp", [3, 5, 8])
def test_tp_must_divide_heads_and_groups(tp):
    # tiny: 8 heads, 4 groups -> tp in {1, 2, 4}; 8 divides the heads but not the groups.
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [f"parallel.tp={tp}"])
    msg = str(e.value)
    assert f"'parallel.tp'={tp}" in msg and "allowed values: [1, 2, 4]" in msg and "tiny.yaml" in msg


def test_compress_ratios_checked():
    with pytest.raises(ConfigError, match=r"allowed ratios: \[0, 4, 128\]"):
        load_config(TINY, ["model.compress_ratios=[0, 4, 64, 4, 128, 0]"])
    with pytest.raises(ConfigError, match="needs one per layer"):
        load_config(TINY, ["model.compress_ratios=[0, 4]"])


def test_layer_spec():
    assert parse_layer_spec("0-2,5", 6) == [0, 1, 2, 5]
    with pytest.raises(ConfigError, match="within 0..5"):
        parse_layer_spec("4-6", 6)
    with pytest.raises(ConfigError, match="not a layer list"):
        parse_layer_spec("a-b", 6)


def test_workload_lists_must_match_requests():
    with pytest.raises(ConfigError, match="prompt_lens' has 2 entries"):
        load_config(TINY, ["workload.requests=3", "workload.prompt_lens=[4, 5]"])


def test_token_budget_must_cover_slots():
    with pytest.raises(ConfigError, match="max_tokens_per_step"):
        load_config(TINY, ["runtime.max_seqs=8", "runtime.max_tokens_per_step=4"])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(ROOT / "configs" / "nope.yaml")


def test_kernels_choice_defaults_and_is_checked():
    assert load_config(TINY).runtime.kernels == "auto"
    assert load_config(TINY, ["runtime.kernels=torch"]).runtime.kernels == "torch"
    with pytest.raises(ConfigError, match=r"'runtime\.kernels' must be one of \['auto', 'torch', 'triton'\]"):
        load_config(TINY, ["runtime.kernels=cuda"])


def test_triton_kernels_refused_where_they_cannot_run(monkeypatch):
    import importlib.util

    import torch

    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton needs a CUDA device, but runtime\.device=cpu"):
        load_config(TINY, ["runtime.kernels=triton", "runtime.device=cpu"])
    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton runs bfloat16 and float32"):
        load_config(TINY, ["runtime.kernels=triton", "runtime.dtype=float64"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton needs the triton package"):
        load_config(TINY, ["runtime.kernels=triton"])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton needs a CUDA device, and none is available"):
        load_config(TINY, ["runtime.kernels=triton"])


def test_kernels_resolve_once_per_device_and_dtype():
    import torch

    from tp_runtime.ops.select import resolve_kernels

    cpu = torch.device("cpu")
    assert resolve_kernels("auto", cpu, torch.float32) == "torch"
    assert resolve_kernels("torch", cpu, torch.float32) == "torch"
    with pytest.raises(ConfigError, match=r"'runtime\.kernels'=triton needs a CUDA device"):
        resolve_kernels("triton", cpu, torch.float32)


# ---------------------------------------------------------------- where a bad value came from


def test_cross_field_error_names_the_override_not_the_file():
    with pytest.raises(ConfigError) as e:
        load_config(TINY, ["workload.requests=-1"])
    assert str(e.value).startswith("override 'workload.requests=-1': "), e.value
    assert "tiny.yaml" not in str(e.value)


def test_cross_field_error_names_the_file_when_the_file_set_it(tmp_path):
    p = tmp_path / "bad.yaml"
    data = yaml.safe_load(Path(TINY).read_text())
    data["runtime"].update(max_seqs=8, max_tokens_per_step=4)
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: ") and "max_tokens_per_step" in str(e.value)


def test_error_names_both_sources_when_two_set_the_values():
    # tp from the command line, the heads and groups from the file: both are named.
    with pytest.raises(ConfigError, match=r"^override 'parallel\.tp=3' and .*tiny\.yaml: 'parallel\.tp'=3"):
        load_config(TINY, ["parallel.tp=3"])


def test_fail_rank_and_layers_errors_name_their_source():
    with pytest.raises(ConfigError, match=r"^override 'parallel\.fail_rank=5'.*must be a rank in 0\.\.1"):
        load_config(TINY, ["parallel.fail_rank=5"])
    with pytest.raises(ConfigError, match=r"^override 'model\.layers=4-9': .*within 0\.\.5"):
        load_config(TINY, ["model.layers=4-9"])


def test_single_layer_as_an_int():
    assert load_config(TINY, ["model.layers=3"]).model.layer_ids() == [3]
    with pytest.raises(ConfigError, match=r"'model\.layers' must be str or int, got list"):
        load_config(TINY, ["model.layers=[3]"])


@pytest.mark.parametrize("text,why", [("", "is empty"), ("# only a comment\n", "is empty"),
                                      ("- a\n- b\n", "top level must be a mapping of sections"),
                                      ("3\n", "top level must be a mapping of sections")])
def test_file_that_is_not_a_mapping_is_refused_with_overrides_too(tmp_path, text, why):
    p = tmp_path / "odd.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_config(p, ["parallel.tp=1"])


def test_directory_as_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
