"""A torchrun rank's error file (parallel/error_file.py): whole or absent where torch's elastic agent reads it."""

from __future__ import annotations

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

from tp_runtime.parallel.error_file import AtomicErrorHandler, record_errors


def _dying_dump(obj, fp) -> None:
    # a rank ended by a signal in the middle of the write (here: the dump stops after a few bytes)
    fp.write('{"mess')
    fp.flush()
    raise KeyboardInterrupt


def _record(handler: ErrorHandler) -> None:
    try:
        raise ValueError("boom")
    except ValueError as e:
        handler.record_exception(e)


def test_a_write_cut_short_leaves_no_error_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(json, "dump", _dying_dump)
    # torch's own handler leaves the half file, on which the agent's read of a failed rank raises
    with pytest.raises(KeyboardInterrupt):
        _record(ErrorHandler())
    with pytest.raises(json.JSONDecodeError):
        ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    path.unlink()
    with pytest.raises(KeyboardInterrupt):
        _record(AtomicErrorHandler())
    assert list(tmp_path.iterdir()) == []  # neither the error file nor its temporary one


def test_the_error_file_is_the_one_torch_reads(tmp_path, monkeypatch) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    _record(AtomicErrorHandler())
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))  # how the agent reads it
    assert failure.message["message"] == "ValueError: boom"
    assert "raise ValueError" in json.loads(path.read_text())["message"]["extraInfo"]["py_callstack"]
    assert list(tmp_path.iterdir()) == [path]


def test_record_errors_writes_the_rank_s_exception_and_reraises(tmp_path, monkeypatch) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record_errors
    def rank_main() -> int:
        raise RuntimeError("rank failed")

    with pytest.raises(RuntimeError, match="rank failed"):
        rank_main()
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert failure.message["message"] == "RuntimeError: rank failed"
