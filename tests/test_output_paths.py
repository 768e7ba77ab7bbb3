"""Outputs replace only a regular file the user named, atomically: workload.dump, bench.output and
write-checkpoint's directory refuse devices, FIFOs, sockets, symlinks to them and the run's own input
file before anything starts, and a failed write leaves the previous file as it was.

Every special file is made here, in the test's temporary directory (a character device by mknod, as
root; skipped where mknod is not permitted). Each refusal checks the exit status 2, one `error:` line
naming the key and the path, no traceback, and the special file's lstat (mode, inode, device) after.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tp_runtime.bench.report import write_jsonl
from tp_runtime.config import load_config
from tp_runtime.engine.workload import build_workload, write_dump
from tp_runtime.paths import (OutputError, OutputReplaceError, atomic_output, check_output_dir,
                              check_output_file, write_text_atomic)
from tp_runtime.weights.checkpoint_write import write_checkpoint
from tp_runtime.weights.format import INDEX
from conftest import TINY, TINY_PATH, assert_refused, run_cli

KINDS = ["fifo", "chardev", "socket", "symlink_to_fifo"]


def make_special(kind: str, d: Path, name: str | None = None) -> Path:
    """A special file of this kind in d (the symlink points at a FIFO beside it)."""
    p = d / (name or kind[:4])  # short: a unix socket's path is limited to 107 bytes
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "chardev":  # the same numbers as /dev/full, made here
        try:
            os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 7))
        except PermissionError as e:  # EPERM: not root, or a container without CAP_MKNOD
            pytest.skip(f"mknod of a character device is not permitted here ({e.strerror})")
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(p))  # the socket file outlives the closed socket
    else:
        os.mkfifo(d / "target_fifo")
        p.symlink_to(d / "target_fifo")
    return p


def snapshot(p: Path) -> list[tuple[int, int, int]]:
    """(st_mode, st_ino, st_rdev) of p itself and, for a symlink, of what it points at."""
    paths = [p] + ([Path(os.path.realpath(p))] if p.is_symlink() else [])
    return [(s.st_mode, s.st_ino, s.st_rdev) for s in map(os.lstat, paths)]


def small_inputs(path: Path) -> Path:
    """A valid workload.inputs file for configs/tiny.yaml (hidden 64): one request, 4 + 2 rows."""
    save_file({"input.0": torch.randn(6, 64), "prompt_len": torch.tensor([4])}, path)
    return path


# ---------------------------------------------------------------- through the CLI


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_run_refuses_a_special_dump_target(tmp_path, kind):
    target = make_special(kind, tmp_path)
    before = snapshot(target)
    proc = run_cli(["run", TINY, "parallel.launcher=local", f"workload.dump={target}"], timeout_s=60)
    line = assert_refused(proc, "workload.dump", target)
    assert "an output replaces only a regular file" in line
    assert snapshot(target) == before and sorted(os.listdir(tmp_path)) == [target.name]


def test_run_refuses_a_dump_that_is_the_inputs_file_by_a_hard_link(tmp_path):
    inputs = small_inputs(tmp_path / "in.safetensors")
    dump = tmp_path / "dump.safetensors"
    os.link(inputs, dump)
    before, data = snapshot(inputs), inputs.read_bytes()
    proc = run_cli(["run", TINY, "parallel.launcher=local", "parallel.tp=1", f"workload.inputs={inputs}",
                    f"workload.dump={dump}"], timeout_s=60)
    line = assert_refused(proc, "workload.dump", dump)
    assert f"workload.inputs={inputs}" in line
    assert snapshot(inputs) == before and inputs.read_bytes() == data


def test_bench_refuses_a_special_file_among_its_outputs(tmp_path):
    out = tmp_path / "bench"
    (out / "tiny").mkdir(parents=True)  # configs/bench_tiny.yaml's sweep is named tiny
    target = make_special("chardev", out / "tiny", "points.jsonl")
    before = snapshot(target)
    proc = run_cli(["bench", "configs/bench_tiny.yaml", f"bench.output={out}"], timeout_s=60)
    assert_refused(proc, "bench.output", target)
    assert snapshot(target) == before and os.listdir(out / "tiny") == ["points.jsonl"]


def test_write_checkpoint_refuses_a_device_as_its_directory(tmp_path):
    target = make_special("chardev", tmp_path)
    before = snapshot(target)
    proc = run_cli(["write-checkpoint", TINY, str(target)], timeout_s=60)
    assert_refused(proc, "write-checkpoint OUT_DIR", target)
    assert snapshot(target) == before


# ---------------------------------------------------------------- the checks and the writer, directly


@pytest.mark.parametrize("kind", KINDS)
def test_check_output_file_refuses_every_special_kind(tmp_path, kind):
    target = make_special(kind, tmp_path)
    before = snapshot(target)
    with pytest.raises(OutputError, match="an output replaces only a regular file") as e:
        check_output_file(target, "workload.dump")
    assert str(e.value).startswith(f"workload.dump={target} is ")
    assert snapshot(target) == before


@pytest.mark.parametrize("kind", KINDS)
def test_check_output_dir_refuses_every_special_kind_as_the_directory_and_inside_it(tmp_path, kind):
    target = make_special(kind, tmp_path)
    before = snapshot(target)
    with pytest.raises(OutputError, match="it must name a directory") as e:
        check_output_dir(target, "bench.output")
    assert str(target) in str(e.value)
    with pytest.raises(OutputError, match="an output replaces only a regular file") as e:
        check_output_dir(tmp_path, "bench.output", files=("notes.txt", target.name))
    assert str(e.value).startswith(f"bench.output={tmp_path}: {tmp_path / target.name} is ")
    assert snapshot(target) == before
    check_output_dir(tmp_path, "bench.output", files=("notes.txt",))  # a missing file is fine


@pytest.mark.parametrize("kind", KINDS)
def test_the_writer_rechecks_at_write_time(tmp_path, kind):
    """A target that was fine when checked and is special when written: nothing replaced, no temp left."""
    target = make_special(kind, tmp_path)
    before, entries = snapshot(target), sorted(os.listdir(tmp_path))
    with pytest.raises(OutputReplaceError, match="an output replaces only a regular file"):
        write_text_atomic(target, "x")
    with pytest.raises(OutputReplaceError):  # became special between the first check and the rename
        regular = tmp_path / "regular.txt"
        with atomic_output(regular) as tmp:
            tmp.write_text("new")
            os.mkfifo(regular)
    assert snapshot(target) == before and stat.S_ISFIFO(os.lstat(regular).st_mode)
    assert sorted(os.listdir(tmp_path)) == sorted(entries + ["regular.txt"])


def test_write_dump_never_replaces_a_special_file(tmp_path):
    target = make_special("fifo", tmp_path)
    before = snapshot(target)
    workload = build_workload(load_config(TINY_PATH, ["workload.requests=1", "workload.prompt_lens=[3]",
                                                      "workload.decode_lens=[1]"]))
    with pytest.raises(OSError, match="is a FIFO"):  # the driver reports an OSError as a failed dump
        write_dump(str(target), workload, {0: torch.zeros(4, 64)})
    assert snapshot(target) == before and os.listdir(tmp_path) == [target.name]


@pytest.mark.parametrize("how", ["same path", "another spelling", "hard link", "symlink"])
def test_dump_equal_to_inputs_is_refused(tmp_path, how):
    inputs = small_inputs(tmp_path / "in.safetensors")
    (tmp_path / "sub").mkdir()
    dump = {"same path": inputs, "another spelling": tmp_path / "sub" / ".." / "in.safetensors",
            "hard link": tmp_path / "link.safetensors", "symlink": tmp_path / "sym.safetensors"}[how]
    if how == "hard link":
        os.link(inputs, dump)
    elif how == "symlink":
        dump.symlink_to(inputs)
    before, data = snapshot(inputs), inputs.read_bytes()
    with pytest.raises(OutputError, match=f"is the same file as workload.inputs={inputs}") as e:
        check_output_file(dump, "workload.dump", keep={"workload.inputs": str(inputs)})
    assert str(e.value).startswith(f"workload.dump={dump} ")
    check_output_file(tmp_path / "other.safetensors", "workload.dump", keep={"workload.inputs": str(inputs)})
    assert snapshot(inputs) == before and inputs.read_bytes() == data


# ---------------------------------------------------------------- atomic writes


def test_a_failed_write_leaves_the_previous_file_and_no_temp_file(tmp_path):
    path = tmp_path / "points.jsonl"
    write_jsonl(path, [{"a": 1}])
    ino, text = os.lstat(path).st_ino, path.read_text()
    with pytest.raises(TypeError):  # the second row cannot be encoded: the write fails half-way
        write_jsonl(path, [{"a": 2}, {"b": object()}])
    assert path.read_text() == text == '{"a": 1}\n' and os.lstat(path).st_ino == ino
    assert os.listdir(tmp_path) == ["points.jsonl"]


def test_a_write_replaces_a_regular_file_keeping_its_mode_and_replaces_a_symlink_without_following_it(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    path.chmod(0o640)
    write_text_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(os.lstat(path).st_mode) == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(path)
    write_text_atomic(link, "via link")
    assert not link.is_symlink() and link.read_text() == "via link" and path.read_text() == "new"
    write_text_atomic(tmp_path / "new" / "dir" / "x.json", "{}")  # missing directories are created
    assert sorted(os.listdir(tmp_path)) == ["link.json", "new", "summary.json"]


# ---------------------------------------------------------------- write-checkpoint's directory


def test_write_checkpoint_never_replaces_or_removes_files_it_did_not_write(tmp_path):
    cfg = load_config(TINY_PATH, ["model.layers=0-1"])
    mine = tmp_path / "model-00002-of-00003.safetensors"  # a shard name, not this writer's file
    save_file({"w": torch.ones(2)}, mine)
    write_checkpoint(cfg, tmp_path, 1)
    assert load_file(mine)["w"].tolist() == [1.0, 1.0]  # not removed as a stale shard
    foreign = tmp_path / "model-00001-of-00002.safetensors"
    save_file({"w": torch.zeros(2)}, foreign)
    before = snapshot(foreign)
    with pytest.raises(OutputError, match="was not written by write-checkpoint") as e:
        write_checkpoint(cfg, tmp_path, 2)
    assert str(e.value).startswith(f"write-checkpoint OUT_DIR={tmp_path}: {foreign} exists")
    assert snapshot(foreign) == before and load_file(foreign)["w"].tolist() == [0.0, 0.0]
    index = json.loads((tmp_path / INDEX).read_text())  # the earlier write is still whole
    assert set(index["weight_map"].values()) == {"model-00001-of-00001.safetensors"}


def test_write_checkpoint_refuses_a_fifo_inside_its_directory(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    before = snapshot(tmp_path / "config.json")
    with pytest.raises(OutputError, match="is a FIFO; an output replaces only a regular file") as e:
        write_checkpoint(load_config(TINY_PATH, ["model.layers=0"]), tmp_path, 1)
    assert str(e.value).startswith(f"write-checkpoint OUT_DIR={tmp_path}: {tmp_path / 'config.json'} is ")
    assert snapshot(tmp_path / "config.json") == before and os.listdir(tmp_path) == ["config.json"]


def test_write_checkpoint_refuses_a_directory_holding_another_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 7168}\n')  # e.g. a released checkpoint's
    (tmp_path / INDEX).write_text('{"metadata": {}, "weight_map": {}}\n')
    with pytest.raises(OutputError, match=f"{tmp_path / INDEX} exists and was not written by write-checkpoint"):
        write_checkpoint(load_config(TINY_PATH, ["model.layers=0"]), tmp_path, 1)
    assert sorted(os.listdir(tmp_path)) == ["config.json", INDEX]
    assert (tmp_path / "config.json").read_text() == '{"hidden_size": 7168}\n'


# ---------------------------------------------------------------- outputs never touch what the run reads


def _refused_here(capsys, argv: list[str], *needles: object) -> str:
    """cli.main(argv) in this process: exit 2 and one `error:` line on stderr holding every needle."""
    from tp_runtime.cli import main as cli_main

    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in map(str, needles):
        assert needle in err[0], (needle, err[0])
    return err[0]


def _tiny_checkpoint(d: Path) -> Path:
    write_checkpoint(load_config(TINY_PATH, ["model.layers=0"]), d, 1)
    return d


@pytest.mark.parametrize("how", ["itself", "symlink"])
def test_run_refuses_a_dump_that_is_its_config_file(capsys, tmp_path, how):
    config = tmp_path / "tiny.yaml"
    config.write_bytes(Path(TINY_PATH).read_bytes())
    dump = config if how == "itself" else tmp_path / "dump.safetensors"
    if how == "symlink":
        dump.symlink_to(config)
    before = config.read_bytes()
    _refused_here(capsys, ["run", str(config), "parallel.launcher=local", f"workload.dump={dump}"],
                  f"workload.dump={dump}", f"CONFIG={config}")
    assert config.read_bytes() == before


def test_run_refuses_a_dump_inside_the_checkpoint_it_loads(capsys, tmp_path):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    shard = ckpt / "model-00001-of-00001.safetensors"
    before = shard.read_bytes()
    _refused_here(capsys, ["run", TINY_PATH, "parallel.launcher=local", f"model.checkpoint={ckpt}", "model.layers=0",
                           f"workload.dump={shard}"], f"workload.dump={shard}", f"lies inside model.checkpoint={ckpt}")
    assert shard.read_bytes() == before


def test_a_checkpoint_file_reached_through_a_symlink_is_protected_where_it_lies(tmp_path):
    ckpt, blobs = _tiny_checkpoint(tmp_path / "ckpt"), tmp_path / "blobs"
    blobs.mkdir()
    shard = ckpt / "model-00001-of-00001.safetensors"
    shard.rename(blobs / "abc")  # a hub cache's layout: the checkpoint folder holds symlinks into a blob store
    shard.symlink_to(blobs / "abc")
    with pytest.raises(OutputError, match=f"is {blobs / 'abc'}, which model.checkpoint={ckpt} holds"):
        check_output_file(blobs / "abc", "workload.dump", keep={"model.checkpoint": str(ckpt)})


def test_write_checkpoint_refuses_the_checkpoint_its_config_reads(capsys, tmp_path):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    _refused_here(capsys, ["write-checkpoint", TINY_PATH, str(ckpt), f"model.checkpoint={ckpt}", "model.layers=0"],
                  f"write-checkpoint OUT_DIR={ckpt}", f"model.checkpoint={ckpt}")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


def test_serve_bench_refuses_results_that_would_overwrite_its_dataset_or_checkpoint(capsys, tmp_path):
    out = tmp_path / "out"
    (out / "x").mkdir(parents=True)
    dataset = out / "x" / "settings.jsonl"  # where serve-bench's settings.jsonl would go
    dataset.write_text('{"prompt_len": 8, "output_len": 4}\n')
    _refused_here(capsys, ["serve-bench", "configs/serve_tiny.yaml", f"serve.output={out}", "name=x",
                           f"serve.dataset={dataset}"], "serve.output", f"serve.dataset={dataset}")
    assert dataset.read_text() == '{"prompt_len": 8, "output_len": 4}\n'
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    _refused_here(capsys, ["serve-bench", "configs/serve_tiny.yaml", f"serve.output={ckpt}", f"model.checkpoint={ckpt}",
                           "model.layers=0"], f"serve.output={ckpt / 'serve_tiny'}", f"model.checkpoint={ckpt}")
    assert not (ckpt / "serve_tiny").exists()


def test_bench_refuses_results_that_would_overwrite_its_base_config(capsys, tmp_path):
    out = tmp_path / "out"
    (out / "tiny").mkdir(parents=True)
    base = out / "tiny" / "summary.json"  # a run config where the sweep's summary would go
    base.write_bytes(Path(TINY_PATH).read_bytes())
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text((Path(TINY_PATH).parent / "bench_tiny.yaml").read_text().replace("base: tiny.yaml",
                                                                                      f"base: {base}"))
    assert f"base: {base}" in sweep.read_text()
    _refused_here(capsys, ["bench", str(sweep), f"bench.output={out}"], "bench.output", f"base={base}")
    assert base.read_bytes() == Path(TINY_PATH).read_bytes()


# ---------------------------------------------------------------- results names stay inside the output folder


@pytest.mark.parametrize("name", ["", "/abs/x", "../escape", "a/../../escape"])
def test_serve_bench_refuses_a_name_that_is_empty_or_escapes_its_output(capsys, tmp_path, name):
    out = tmp_path / "out"
    line = _refused_here(capsys, ["serve-bench", "configs/serve_tiny.yaml", f"serve.output={out}", f"name={name}"],
                         f"name={name!r}", f"serve.output={out}")
    assert "non-empty relative path" in line
    assert sorted(os.listdir(tmp_path)) == []


def test_a_name_leading_out_through_a_symlink_is_refused(tmp_path):
    from tp_runtime.results_folder import results_path

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path)
    with pytest.raises(OutputError, match="outside it"):
        results_path(tmp_path / "out", "link/x", "bench.output")
    assert results_path(tmp_path / "out", "a/b", "bench.output") == tmp_path / "out" / "a" / "b"


def test_bench_refuses_an_empty_name(capsys, tmp_path):
    _refused_here(capsys, ["bench", "configs/bench_tiny.yaml", f"bench.output={tmp_path}", "name="],
                  "name=''", f"bench.output={tmp_path}")
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- dumps: folders, modes, long names


def test_a_dump_with_a_trailing_slash_names_a_folder_and_is_refused(capsys, tmp_path):
    dump = f"{tmp_path}/x/"
    _refused_here(capsys, ["run", TINY_PATH, "parallel.launcher=local", f"workload.dump={dump}"],
                  f"workload.dump={dump}", "names a folder")
    assert os.listdir(tmp_path) == []


def test_a_replaced_dump_keeps_its_mode_and_a_new_one_gets_the_umasks(tmp_path):
    workload = build_workload(load_config(TINY_PATH, ["workload.requests=1", "workload.prompt_lens=[3]",
                                                      "workload.decode_lens=[1]"]))
    old, new = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    old.write_text("x")
    old.chmod(0o644)
    write_dump(str(old), workload, {0: torch.zeros(4, 64)})
    write_dump(str(new), workload, {0: torch.zeros(4, 64)})
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o644 and stat.S_IMODE(os.stat(new).st_mode) == 0o666 & ~umask
    assert load_file(old)["output.0"].shape == (4, 64)


@pytest.mark.parametrize("what", ["name", "path"])
def test_a_dump_name_or_path_over_the_limit_is_one_line(capsys, tmp_path, what):
    dump = tmp_path / ("a" * 300) if what == "name" else tmp_path / "/".join(["b" * 200] * 25)
    line = _refused_here(capsys, ["run", TINY_PATH, "parallel.launcher=local", f"workload.dump={dump}"],
                         "workload.dump=")
    assert "too long" in line
    with pytest.raises(OutputError, match="too long"):  # a results folder's long name, too
        check_output_dir(dump, "bench.output")


# ---------------------------------------------------------------- results folders: one writer, one run's files


def test_a_second_writer_of_a_results_folder_is_refused(capsys, tmp_path):
    import fcntl

    folder = tmp_path / "serve_tiny"
    folder.mkdir()
    with open(folder / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run writing the folder
        _refused_here(capsys, ["serve-bench", "configs/serve_tiny.yaml", f"serve.output={tmp_path}"],
                      "serve.output", f"{folder} is being written by another run")
        _refused_here(capsys, ["bench", "configs/bench_tiny.yaml", f"bench.output={tmp_path}", "name=serve_tiny"],
                      "bench.output", f"{folder} is being written by another run")
    assert sorted(os.listdir(folder)) == [".lock"]


def test_published_results_replace_the_earlier_runs_files_all_together(tmp_path):
    from tp_runtime.results_folder import ResultsFolder

    folder, outside = tmp_path / "out" / "x", tmp_path / "outside.txt"
    folder.mkdir(parents=True)
    outside.write_text("not a result")
    for name in ("summary.json", "plot.png", "notes.txt"):
        (folder / name).write_text("old")
    (folder / "rounds.jsonl").symlink_to(outside)
    files = ("summary.json", "rounds.jsonl", "plot.png", "traces")
    with ResultsFolder(folder, files, "serve.output") as results:
        write_text_atomic(results.staging / "summary.json", "new")
        write_text_atomic(results.staging / "rounds.jsonl", "new rounds")
        assert (folder / "summary.json").read_text() == "old"  # nothing published yet
    assert (folder / "unfinished" / "summary.json").read_text() == "new"  # a run that stopped: kept apart
    assert (folder / "summary.json").read_text() == "old" and (folder / "rounds.jsonl").is_symlink()
    with ResultsFolder(folder, files, "serve.output") as results:
        assert os.listdir(results.staging) == []  # the unfinished run's files are gone
        write_text_atomic(results.staging / "summary.json", "new")
        write_text_atomic(results.staging / "rounds.jsonl", "new rounds")
        (results.staging / "traces").mkdir()
        results.publish()
    assert sorted(os.listdir(folder)) == [".lock", "notes.txt", "rounds.jsonl", "summary.json", "traces"]
    assert (folder / "summary.json").read_text() == "new" and (folder / "notes.txt").read_text() == "old"
    assert not (folder / "rounds.jsonl").is_symlink() and (folder / "rounds.jsonl").read_text() == "new rounds"
    assert outside.read_text() == "not a result"


def test_an_input_inside_the_staging_folder_is_refused_before_it_is_emptied(tmp_path):
    from tp_runtime.results_folder import ResultsFolder

    dataset = tmp_path / "x" / "unfinished" / "requests.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text("kept")
    with pytest.raises(OutputError, match=f"serve.dataset={dataset} lies inside"):
        ResultsFolder(tmp_path / "x", ("summary.json",), "serve.output", {"serve.dataset": str(dataset)})
    assert dataset.read_text() == "kept"
