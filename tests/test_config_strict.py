"""Strict config reading (config_yaml.py) and value ranges: YAML 1.2 numbers, duplicate and non-string keys,
config paths that are not regular files, one-line errors; rope / YaRN / eps / timeout ranges.

In-process where the loader decides; through the CLI (tests/conftest.run_cli) once per class of error for
`run` and for `bench`, asserting exit status 2, exactly one `error:` line naming the path or key, no
traceback, and for special files that they were neither opened nor replaced.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from conftest import ROOT, TINY_PATH as TINY, assert_refused, run_cli
from tp_runtime.bench.sweep_config import load_sweep
from tp_runtime.config import ConfigError, load_config
from tp_runtime.config_yaml import MAX_BYTES, parse_value, read_mapping

SWEEP = str(ROOT / "configs" / "bench_tiny.yaml")


def snapshot(path: Path) -> tuple:
    """What must not change when a special file is refused: inode, type, size, times."""
    st = os.stat(path)
    return st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns


# ---------------------------------------------------------------- YAML 1.2 scalars, files and overrides alike


@pytest.mark.parametrize("raw,value", [("1e-6", 1e-6), ("1.0e-6", 1e-6), ("-2.5E+3", -2500.0), (".5", 0.5),
                                       ("1.", 1.0), (".inf", float("inf")), ("-.Inf", float("-inf")),
                                       ("010", 10), ("+7", 7), ("true", True), ("False", False), ("~", None),
                                       ("null", None), ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"),
                                       ("1:00", "1:00"), ("0x2", "0x2"), ("0o7", "0o7"), ("1_000", "1_000"),
                                       ("2001-12-14", "2001-12-14"), ("tRue", "tRue")])
def test_scalars_resolve_by_yaml_1_2(raw, value):
    got = parse_value(raw, "override")
    assert got == value and type(got) is type(value), (raw, got)
    assert parse_value(f"[{raw}]", "override") == [value]


def test_yaml_1_2_in_overrides():
    cfg = load_config(TINY, ["model.rms_norm_eps=1e-6"])
    assert cfg.model.rms_norm_eps == 1e-6 and isinstance(cfg.model.rms_norm_eps, float)
    for word in ("parallel.tp=1:00", "parallel.tp=0x2"):
        with pytest.raises(ConfigError, match=rf"override '{word}'.*'parallel\.tp' must be int, got str"):
            load_config(TINY, [word])


def test_yaml_1_2_in_files(tmp_path):
    p, tiny = tmp_path / "c.yaml", Path(TINY).read_text()
    assert "rms_norm_eps: 1.0e-6" in tiny and "\n  tp: 2\n" in tiny
    p.write_text(tiny.replace("rms_norm_eps: 1.0e-6", "rms_norm_eps: 1e-5"))
    assert load_config(p).model.rms_norm_eps == 1e-5
    for tp in ("1:00", "0x2"):
        p.write_text(tiny.replace("\n  tp: 2\n", f"\n  tp: {tp}\n"))
        with pytest.raises(ConfigError, match=r"'parallel\.tp' must be int, got str"):
            load_config(p)


@pytest.mark.parametrize("raw", ["!!int 0x2", "!!float abc", "!!timestamp 2001-01-01"])
def test_explicit_tags_are_checked_too(raw):
    with pytest.raises(ConfigError, match=r"^override: value:1:1: "):
        parse_value(raw, "override")


# ---------------------------------------------------------------- keys


def test_duplicate_section_names_both_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("runtime:\n  max_len: 64\nparallel:\n  tp: 1\nruntime:\n  max_len: 128\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}:5:1: duplicate key 'runtime' (first given at line 1, column 1)"


def test_duplicate_key_in_a_section_and_in_an_override(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("model:\n  layers: 0-1\n  hidden_size: 64\n  layers: 2-3\n")
    with pytest.raises(ConfigError,
                       match=rf"^{re.escape(str(p))}:4:3: duplicate key 'layers' \(first given at line 2, column 3\)$"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"duplicate key 'factor' \(first given at line 1, column 2\)"):
        load_config(TINY, ["model.rope_scaling={factor: 4, factor: 8}"])


@pytest.mark.parametrize("text,key", [("1: one\nfoo: bar\n", "key 1 (int)"), ("foo: bar\n1: one\n", "key 1 (int)"),
                                      ("model:\n  true: 1\n", "key True (bool)"),
                                      ("model:\n  ~: 1\n", "key None (NoneType)")])
def test_non_string_keys_one_clean_message(tmp_path, text, key):
    p = tmp_path / "k.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError,
                       match=rf"^{re.escape(str(p))}:\d+:\d+: {re.escape(key)} is not a string; "
                             "config keys are names$"):
        load_config(p)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(sweep))}:\d+:\d+: {re.escape(key)} is not a string"):
        load_sweep(sweep)


def test_mixed_unknown_keys_built_in_code_are_sorted_as_text():
    from tp_runtime.config import RunConfig, from_mapping

    with pytest.raises(ConfigError, match=r"unknown key '1'"):
        from_mapping(RunConfig, {1: "one", "foo": "bar"}, "", "<dict>")


# ---------------------------------------------------------------- one-line YAML errors


@pytest.mark.parametrize("text,where", [("model: [unclosed\n", "2:1"), ("model:\n  a: b: c\n", "2:7"),
                                        ("model:\n\thidden_size: 64\n", "2:1"), ("a: 1\n---\nb: 2\n", "2:1"),
                                        ("model: {a: 1\0}\n", "1:13")])
def test_yaml_errors_are_one_line(tmp_path, text, where):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{where}: ") and "\n" not in msg, msg


def test_override_yaml_error_is_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(TINY, ["workload.prompt_len=[3, 9"])
    msg = str(e.value)
    assert msg.startswith("override 'workload.prompt_len=[3, 9': value:1:") and "\n" not in msg, msg


# ---------------------------------------------------------------- paths that are not regular text files


def test_fifo_is_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    before = snapshot(fifo)
    result: list = []  # a reader that opened the FIFO would block; a thread keeps the test from hanging
    t = threading.Thread(target=lambda: result.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading the config FIFO blocked"
    assert result == [f"config file {fifo} is a FIFO, not a regular file"]
    assert snapshot(fifo) == before


def _refusal(path) -> str:
    try:
        load_config(path)
    except ConfigError as e:
        return str(e)
    return "accepted"


@pytest.mark.parametrize("path,what", [("/dev/null", "is a character device, not a regular file"),
                                       ("/bin/ls", "is not a YAML text file (byte ")])
def test_system_files_are_refused(path, what):
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist on this machine")
    before = snapshot(Path(path))
    for load, kind in ((load_config, "config file"), (load_sweep, "sweep config")):
        with pytest.raises(ConfigError) as e:
            load(path)
        assert str(e.value).startswith(f"{kind} {path} {what}"), e.value
    assert snapshot(Path(path)) == before


def test_directory_socket_and_oversized_file(tmp_path):
    import socket

    with pytest.raises(ConfigError,
                       match=rf"^sweep config {re.escape(str(tmp_path))} is a directory, not a regular file"):
        load_sweep(tmp_path)
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(ConfigError, match="is a socket, not a regular file"):
            read_mapping(sock_path, "config file", "sections")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match=rf"is {MAX_BYTES + 3} bytes; a config is YAML text of at most"):
        load_config(big)


def test_sweep_base_and_model_file_use_the_same_reader(tmp_path):
    os.mkfifo(tmp_path / "base.fifo")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: base.fifo\ngrid: {bench.batch: [1], bench.context: [8]}\n")
    with pytest.raises(ConfigError, match=r"base\.fifo is a FIFO, not a regular file"):
        load_sweep(sweep)
    (tmp_path / "m.yaml").write_text("model:\n  hidden_size: 64\nmodel:\n  hidden_size: 32\n")
    sweep.write_text(f"base: {TINY}\ngrid: {{bench.batch: [1], bench.context: [8], model_file: [m.yaml]}}\n")
    with pytest.raises(ConfigError, match=r"m\.yaml:3:1: duplicate key 'model'"):
        load_sweep(sweep)
    sweep.write_text(f"base: {TINY}\ngrid: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"'grid' must be a mapping, got \[1, 2\]"):
        load_sweep(sweep)


# ---------------------------------------------------------------- value ranges


@pytest.mark.parametrize("word,needle", [
    ("model.rope_theta=0", "'model.rope_theta' must be a finite number > 1 (a rotary base)"),
    ("model.rope_theta=1", "'model.rope_theta' must be a finite number > 1"),
    ("model.compress_rope_theta=-160000", "'model.compress_rope_theta' must be a finite number > 1"),
    ("model.compress_rope_theta=.inf", "'model.compress_rope_theta' must be a finite number > 1"),
    ("model.rope_scaling.factor=-16", "'model.rope_scaling.factor' must be a finite number > 0"),
    ("model.rope_scaling.factor=.nan", "'model.rope_scaling.factor' must be a finite number > 0"),
    ("model.rope_scaling.original_max_position_embeddings=0",
     "'model.rope_scaling.original_max_position_embeddings' must be a finite number > 0"),
    ("model.rope_scaling.beta_fast=-32", "'model.rope_scaling.beta_fast' must be a finite number > 0"),
    ("model.rope_scaling.beta_slow=0", "'model.rope_scaling.beta_slow' must be a finite number > 0"),
    ("model.rope_scaling.beta_slow=40", "'model.rope_scaling.beta_fast'=32 must be greater than beta_slow=40"),
    ("model.rms_norm_eps=.nan", "'model.rms_norm_eps' must be a finite number > 0"),
    ("model.rms_norm_eps=0", "'model.rms_norm_eps' must be a finite number > 0"),
    ("model.rms_norm_eps=-1e-6", "'model.rms_norm_eps' must be a finite number > 0"),
    ("parallel.timeout_s=.inf", "'parallel.timeout_s' must be a finite number > 0 and <= 604800 seconds"),
    ("parallel.timeout_s=1e300", "'parallel.timeout_s' must be a finite number > 0 and <= 604800 seconds"),
    ("parallel.timeout_s=0", "'parallel.timeout_s' must be a finite number > 0"),
    ("parallel.placement_timeout_s=-1", "'parallel.placement_timeout_s' must be a finite number > 0"),
])
def test_value_ranges_name_the_override(word, needle):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [word])
    sources, _, msg = str(e.value).partition(": '")
    assert f"override {word!r}" in sources and f"'{msg}".startswith(needle), e.value


def test_value_range_from_a_file_names_the_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("model:\n  rope_scaling: {factor: 16.0, beta_fast: 1.0, beta_slow: 32.0}\n")
    with pytest.raises(ConfigError,
                       match=rf"^{re.escape(str(p))}: 'model\.rope_scaling\.beta_fast'=1 must be greater than"):
        load_config(p)


# ---------------------------------------------------------------- the CLI: one error line, exit 2, nothing opened


def test_cli_run_refuses_special_paths_and_bad_yaml(tmp_path):
    fifo, dup = tmp_path / "c.fifo", tmp_path / "dup.yaml"
    os.mkfifo(fifo)
    dup.write_text("runtime:\n  max_len: 64\nruntime:\n  max_len: 128\n")
    before = snapshot(fifo)
    assert_refused(run_cli(["run", str(fifo)], timeout_s=60), str(fifo), "is a FIFO")
    assert snapshot(fifo) == before
    assert_refused(run_cli(["run", "/dev/null"], timeout_s=60), "/dev/null", "character device")
    assert_refused(run_cli(["run", str(dup)], timeout_s=60), f"{dup}:3:1: duplicate key 'runtime'")
    assert_refused(run_cli(["run", "configs/tiny.yaml", "model.rope_scaling.factor=-16"], timeout_s=60),
              "'model.rope_scaling.factor'")
    assert_refused(run_cli(["run", "configs/tiny.yaml", "parallel.tp=0x2"], timeout_s=60), "'parallel.tp' must be int")


def test_cli_bench_refuses_special_paths_and_bad_yaml(tmp_path):
    fifo, mixed = tmp_path / "s.fifo", tmp_path / "mixed.yaml"
    os.mkfifo(fifo)
    mixed.write_text("1: one\nfoo: bar\n")
    before = snapshot(fifo)
    assert_refused(run_cli(["bench", str(fifo)], timeout_s=60), str(fifo), "is a FIFO")
    assert snapshot(fifo) == before
    for path, what in ((str(tmp_path), "is a directory"), ("/dev/null", "character device"),
                       ("/bin/ls", "is not a YAML text file")):
        if os.path.exists(path):
            assert_refused(run_cli(["bench", path], timeout_s=60), path, what)
    assert_refused(run_cli(["bench", str(mixed)], timeout_s=60), f"{mixed}:1:1: key 1 (int) is not a string")
    assert_refused(run_cli(["bench", SWEEP, "parallel.timeout_s=.inf"], timeout_s=60), "'parallel.timeout_s'")


# ---------------------------------------------------------------- each rank's memory against the device's

HUGE = 10**12  # positions or sequences: petabytes of cache on any machine


@pytest.mark.parametrize("words,keys", [
    ([f"runtime.max_len={HUGE}"], ["runtime.max_len=1000000000000", "caches", "TiB"]),
    ([f"runtime.max_seqs={HUGE}", f"runtime.max_tokens_per_step={HUGE}"], ["runtime.max_seqs=1000000000000", "PiB"]),
])
def test_memory_check_names_keys_and_sizes(words, keys):
    from tp_runtime.memory_fit import check_memory

    cfg = load_config(TINY, words + ["parallel.launcher=local", "runtime.device=cpu"])
    with pytest.raises(ConfigError) as e:
        check_memory(cfg)
    msg = str(e.value)
    assert msg.startswith("override ") or " and override " in msg.split(": ")[0], msg
    assert "each rank needs" in msg and "this host has" in msg and "shared by the 2 ranks" in msg, msg
    for k in keys:
        assert k in msg, (k, msg)


def test_memory_budget_boundary():
    """The refusal starts one byte past the budget, for every rank that shares it."""
    from tp_runtime.memory_fit import Budget, refusal
    from tp_runtime.memory_model import rank_memory

    cfg = load_config(TINY, ["runtime.device=cpu"])
    parts = rank_memory(cfg, "cpu")
    need = sum(parts.values())
    assert parts["weights"] > 0 and parts["caches"] > 0 and parts["workspace"] > 0
    assert refusal(cfg, parts, Budget(2 * need, "host", 2)) is None
    assert "needs" in refusal(cfg, parts, Budget(2 * need - 1, "host", 2))
    doubled = rank_memory(load_config(TINY, ["runtime.device=cpu", "runtime.max_seqs=9"]), "cpu")
    assert doubled["caches"] == parts["caches"] * 2 and doubled["weights"] == parts["weights"]  # 4 + 1 -> 9 + 1 slots


def test_host_memory_is_read():
    from tp_runtime.memory_fit import host_available_bytes

    assert 0 < host_available_bytes() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_sweep_memory_check():
    from tp_runtime.bench.sweep_memory import check_sweep_memory

    check_sweep_memory(load_sweep(SWEEP))  # the CPU smoke sweep fits
    for tp, who in ((1, "rank 0 of the group at tp=1"), (2, "the 2 ranks of the group at tp=2")):
        sweep = load_sweep(SWEEP, [f"grid.bench.context=[12,{HUGE}]", f"grid.parallel.tp=[{tp}]", "runtime.device=cpu"])
        with pytest.raises(ConfigError, match=rf"{who} .*needs .*TiB.*this host has .*grid 'bench\.batch' and "
                                              r"'bench\.context'"):
            check_sweep_memory(sweep)


def test_cli_memory_refused_before_any_rank():
    assert_refused(run_cli(["run", "configs/tiny.yaml", f"runtime.max_len={HUGE}"], timeout_s=60),
              "runtime.max_len", "each rank needs")
    assert_refused(run_cli(["bench", SWEEP, f"grid.bench.context=[{HUGE}]"], timeout_s=60),
              "bench.context", "needs")


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_memory_check_names_the_gpu():
    r = run_cli(["run", "configs/tiny.yaml", "runtime.device=cuda", "parallel.launcher=local", "parallel.tp=1",
                 "runtime.max_seqs=4096", "runtime.max_tokens_per_step=4096", "runtime.max_len=100000000"],
                timeout_s=120)
    assert_refused(r, "runtime.max_len=100000000", "GPU 0 (", "caches")


# ---------------------------------------------------------------- values no run can use, refused up front


@pytest.mark.parametrize("words,needles", [
    (["graph.capture_sizes=[4, 2, 2, 1]"], ["'graph.capture_sizes' lists [2] more than once"]),
    (["model.sliding_window=4096", "runtime.max_len=512"],
     ["'model.sliding_window'=4096 is more than 2x runtime.max_len=512"]),
    (["model.head_dim=33"], ["'model.head_dim'=33 must be even"]),
    (["model.index_head_dim=17"], ["'model.index_head_dim'=17 must be even"]),
    ([f"workload.seed={2**70}"], ["'workload.seed'", "outside int64"]),
    ([f"runtime.seed={-2**64}"], ["'runtime.seed'", "outside int64"]),
    (["parallel.timeout_s=0.001"], ["'parallel.timeout_s'=0.001 is below the shortest collective timeout, 1 s"]),
])
def test_unusable_values_are_refused_naming_the_key(words, needles):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, words)
    for needle in needles + [f"override {words[0]!r}"]:
        assert needle in str(e.value), str(e.value)


def test_values_at_the_limits_are_accepted():
    """The edges of the new refusals still load: a window of twice max_len (a released config at a short
    max_len), int64's extreme seeds, a one-second timeout, distinct capture sizes."""
    cfg = load_config(TINY, ["runtime.max_len=8", f"workload.seed={2**63 - 1}", f"runtime.seed={-2**63}",
                             "parallel.timeout_s=1", "graph.capture_sizes=[4, 2, 1]", "model.head_dim=34"])
    assert cfg.model.sliding_window == 16 and cfg.parallel.timeout_s == 1.0


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("where", ["config", "sweep", "override"])
def test_yaml_nested_thousands_deep_is_one_error_line(tmp_path, where):
    deep = tmp_path / "deep.yaml"
    deep.write_text(f"model: {_deep(3000)}\n" if where == "config" else f"grid: {{modes: {_deep(3000)}}}\n")
    args = {"config": ["run", str(deep)], "sweep": ["bench", str(deep)],
            "override": ["run", TINY, f"workload.prompt_len={_deep(3000)}"]}[where]
    assert_refused(run_cli(args, timeout_s=60), "nested too deeply")


def test_symmetric_memory_on_a_host_without_gpus_is_refused_before_any_rank(monkeypatch):
    import tp_runtime.config.device_checks as dc
    from tp_runtime.config import check_machine

    monkeypatch.setattr(dc, "machine_device", lambda device: "cpu")
    cfg = load_config(TINY, ["parallel.launcher=local", "parallel.allreduce=symm_one_shot"])
    with pytest.raises(ConfigError, match=r"override 'parallel.allreduce=symm_one_shot'.*this machine has none"):
        check_machine(cfg)
    check_machine(load_config(TINY, ["parallel.launcher=local", "parallel.allreduce=auto"]))  # auto: accepted


@pytest.mark.parametrize("word", ["runtime.max_len=64", "runtime.max_seqs=2", "graph.mode=full",
                                  "runtime.prefill_chunk=8"])
def test_bench_refuses_words_for_keys_it_sets_itself(word):
    with pytest.raises(ConfigError, match=rf"override '{re.escape(word)}': the bench sets '{word.split('=')[0]}'"):
        load_sweep(SWEEP, [word])


def test_bench_copy_mib_above_the_limit_is_refused():
    from tp_runtime.bench.sweep_config import MAX_COPY_MIB

    with pytest.raises(ConfigError, match=rf"'bench.copy_mib'=1000000 is above the limit of {MAX_COPY_MIB} MiB"):
        load_sweep(SWEEP, ["bench.copy_mib=1000000"])
    assert load_sweep(SWEEP, [f"bench.copy_mib={MAX_COPY_MIB}"]).bench.copy_mib == MAX_COPY_MIB


@pytest.mark.parametrize("args,needle", [(["configs/v4_flash.yaml", "abc"], "device memory 'abc'"),
                                         (["configs/v4_flash.yaml", "-5"], "device memory '-5'"),
                                         (["configs/nope.yaml"], "configs/nope.yaml does not exist")])
def test_roofline_bad_arguments_are_one_error_line(args, needle):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tp_runtime.bench.roofline", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert_refused(r, needle)


def test_roofline_of_the_tiny_config_prints_its_bf16_table(capsys):
    from tp_runtime.bench.roofline import main

    assert main([TINY]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[2:-1]]
    assert rows and set(rows) == {"bf16"} and "no fp8 cache rows" in out


@pytest.mark.parametrize("script", ["kernels_per_layer.py", "loop_overhead.py"])
def test_gpu_benchmarks_without_a_gpu_say_so_in_one_line(script):
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    module = f"benchmarks.{script.removesuffix('.py')}"
    r = subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_refused(r, script, "needs a CUDA GPU")
