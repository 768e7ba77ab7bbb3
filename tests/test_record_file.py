"""bench/record_file: every record carries the header, its own keys unchanged; the file is replaced whole."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tp_runtime.bench import record_file
from tp_runtime.bench.record_file import git_commit, record_header, write_records


def test_header_names_command_commit_versions_and_settings(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "benchmarks.x", "--out", "a b"], raising=False)
    h = record_header({"iters": 3})
    assert h["command"] == "python -m benchmarks.x --out 'a b'"
    assert h["torch"] == torch.__version__ and h["settings"] == {"iters": 3}
    assert set(h) == {"command", "git_commit", "gpu", "torch", "triton", "settings"}
    if not torch.cuda.is_available():
        assert h["gpu"] is None


def test_git_commit_outside_a_checkout_is_none(tmp_path):
    assert git_commit(tmp_path) is None


def test_records_are_json_lines_with_the_header(tmp_path, monkeypatch):
    monkeypatch.setattr(record_file, "git_commit", lambda: "abc123")
    path = tmp_path / "sub" / "out.jsonl"
    assert write_records(path, [{"rows": [1, 2]}, {"torch": "kept"}], settings={"out": tmp_path}) == path
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "header"} for r in lines] == [{"rows": [1, 2]}, {"torch": "kept"}]
    assert all(r["header"]["git_commit"] == "abc123" and r["header"]["settings"] == {"out": str(tmp_path)}
               for r in lines)


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "out.jsonl"
    write_records(path, [{"a": 1}], settings={})
    before = path.read_text()
    with pytest.raises(TypeError):
        write_records(path, [{"a": 1}, 5], settings={})  # not a mapping: fails before anything is replaced
    assert path.read_text() == before and os.listdir(tmp_path) == ["out.jsonl"]


def test_a_replace_writes_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    write_records(path, [{"a": 1}], settings={})

    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_records(path, [{"a": 2}], settings={})
    assert json.loads(path.read_text())["a"] == 1 and os.listdir(tmp_path) == ["out.jsonl"]
