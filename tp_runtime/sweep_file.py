"""The file shape `bench` and `serve-bench` read: a base run config, override words, a grid and a section of their own.

    name: NAME                     # default: the file's stem
    base: v4_flash.yaml            # a run config file (beside this file, or the working directory), or a mapping
    overrides: [key=value, ...]    # words as on the command line, applied first
    grid: {...}                    # the command's axes
    OWN: {...}                     # the command's settings (`bench` or `serve`)

Command-line words `OWN.<key>`, `grid.<key>` and `name` change the command's own parts; a dotted run-config key
(model.*, parallel.*, ...) changes the base. Errors name the file, the key and the word that set it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tp_runtime.config import ConfigError, parse_override, read_yaml, set_dotted
from tp_runtime.config_yaml import read_mapping

RUN_SECTIONS = ("model", "parallel", "runtime", "workload", "graph")


@dataclass
class SweepFile:
    """One file read with its override words applied (copies: the caller may change them)."""

    name: str
    base: dict  # the run config mapping every setting starts from
    grid: dict
    own: dict  # the command's own section
    base_file: str | None = None  # the base run config's file (None: inline); the run reads it


def read_sweep_file(path: Path, what: str, own_key: str, overrides: list[str] | None = None) -> SweepFile:
    """Read `path` (a `what`, e.g. "sweep config") whose own section is `own_key`, then apply the file's
    `overrides` and the command line's words, in that order."""
    top_keys = ("name", "base", "overrides", "grid", own_key)
    data = read_mapping(path, what, f"the keys {list(top_keys)}")
    unknown = sorted(set(data) - set(top_keys), key=str)
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}'; allowed top-level keys: {list(top_keys)}")
    base = data.get("base")
    f = SweepFile(_name(data.get("name", path.stem)), _base_mapping(base, path),
                  _section(data, "grid", path), _section(data, own_key, path),
                  str(resolve_beside(base, path)) if isinstance(base, str) else None)
    in_file = data.get("overrides") or []
    if not isinstance(in_file, list) or not all(isinstance(w, str) for w in in_file):
        raise ConfigError(f"{path}: 'overrides' must be a list of 'key=value' strings, got {in_file!r}")
    for word in in_file + list(overrides or []):
        _apply(f, word, own_key)
    return f


def _apply(f: SweepFile, word: str, own_key: str) -> None:
    key, value = parse_override(word)
    where = f"override {word!r}"
    if key == "name":
        f.name = _name(value)
    elif key.startswith("grid."):
        f.grid[key[5:]] = value
    elif key.startswith(own_key + "."):  # dotted below it too: serve.goodput.ttft_ms=500 sets one limit
        set_dotted({own_key: f.own}, key, value, where)
    elif key.split(".")[0] in RUN_SECTIONS:
        set_dotted(f.base, key, value, where)
    else:
        raise ConfigError(f"{where}: unknown key '{key}'; use name, {own_key}.<key>, grid.<key> "
                          f"or a run-config key under {list(RUN_SECTIONS)}")


def _name(value: Any) -> str:
    """The results name as written ('' for an empty `name=` or `name:`, which the output check refuses)."""
    return "" if value is None else str(value)


def _section(data: dict, key: str, path: Path) -> dict:
    """A copy of the mapping under `key` ({} when absent or null)."""
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{key}' must be a mapping, got {value!r}")
    return dict(value)


def _base_mapping(base: Any, path: Path) -> dict:
    """The base run config: an inline mapping, or a file beside `path` or in the working directory."""
    if isinstance(base, dict):
        return copy.deepcopy(base)
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be a run config file or an inline mapping, got {base!r}")
    return read_yaml(resolve_beside(base, path))


def resolve_beside(name: str, path: Path | str) -> Path:
    """A file named inside the file at `path`: relative to that file first, then to the working directory."""
    for cand in (Path(path).parent / name, Path(name)):
        if cand.exists():  # what it is (a directory, a FIFO) the reader says, without opening it
            return cand
    raise ConfigError(f"{path}: file {name!r} not found (looked beside {Path(path).name} and in the working "
                      "directory)")
