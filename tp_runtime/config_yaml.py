"""Strict YAML reading for every config the commands take (run configs, sweeps, `key=value` overrides).

    data = read_mapping("configs/tiny.yaml", "config file", "sections ['model', ...]")
    value = parse_value("1e-6", "override 'model.rms_norm_eps=1e-6'")   # 1e-06, a float

Scalars resolve by the YAML 1.2 core schema, in files and overrides alike: `1e-6` is a float (YAML 1.1
wants a dot), `yes` / `no` / `on` / `off` are strings, and `1:00` (1.1 base 60), `1_000`, `010` as octal
and dates stay what they look like: strings, or decimal `10`. The 0x / 0o integer forms are not resolved
either, so `parallel.tp=0x2` is the string '0x2' and refused where a number is expected. A key given
twice in one mapping is refused with both lines; every key must be a string (config keys are names).

A config path is stat()ed before it is opened: a directory, FIFO, socket or device is refused without
being opened (a FIFO would block the reader), and a regular file must be UTF-8 text of at most
MAX_BYTES. YAML nested deeper than the parser's recursion reaches is refused too. Every refusal is a
ConfigError whose message is one line; YAML errors read `FILE:LINE:COL: message`.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value that cannot be accepted; the message names key, source and allowed values."""


MAX_BYTES = 4 << 20  # a config is a few KiB; a larger file is not a config (a checkpoint shard, a log)
# PyYAML parses nested collections by recursion: nesting past Python's recursion limit (a few hundred levels;
# a config has three) would end the reader with a RecursionError.
TOO_DEEP = "collections nested too deeply (a config nests sections a few levels deep)"

# YAML 1.2 core schema, minus the 0o / 0x integer forms (a config never needs them; '0x2' stays a string).
# Anchored: PyYAML's resolver matches at the start only, and '1e-6' must not resolve as the int '1'.
NULL = re.compile(r"(?:~|null|Null|NULL|)\Z")
BOOL = re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")
INT = re.compile(r"[-+]?[0-9]+\Z")
FLOAT = re.compile(r"(?:[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))\Z")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, duplicate keys refused and string keys only."""

    yaml_implicit_resolvers: dict = {}  # replaced below: none of SafeLoader's YAML 1.1 resolvers

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}",
                                                    node.start_mark)
        seen: dict[str, str] = {}  # key -> where it was first given
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} ({type(key).__name__}) is not a string; config keys are names",
                    key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first given at {seen[key]})", key_node.start_mark)
            seen[key] = f"line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1}"
        return super().construct_mapping(node, deep=deep)


def _scalar(loader: StrictLoader, node: yaml.ScalarNode, pattern: re.Pattern, kind: str) -> str:
    """The node's text, which must match `pattern` (an explicit tag such as `!!int 0x2` is checked too)."""
    text = loader.construct_scalar(node)
    if not pattern.match(text):
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a YAML 1.2 {kind}", node.start_mark)
    return text


def _float(text: str) -> float:
    low = text.lower()
    if low.lstrip("+-") == ".inf":
        return -math.inf if low.startswith("-") else math.inf
    return math.nan if low == ".nan" else float(text)


for _tag, _pattern, _first, _make, _kind in (
        ("null", NULL, ["~", "n", "N", ""], lambda t: None, "null"),
        ("bool", BOOL, list("tTfF"), lambda t: t.lower() == "true", "bool"),
        ("int", INT, list("-+0123456789"), int, "integer"),
        ("float", FLOAT, list("-+.0123456789"), _float, "float")):
    StrictLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", _pattern, _first)
    StrictLoader.add_constructor(
        f"tag:yaml.org,2002:{_tag}",
        lambda loader, node, p=_pattern, k=_kind, f=_make: f(_scalar(loader, node, p, k)))


def _yaml_1_1_only(loader: StrictLoader, node: yaml.Node) -> None:
    raise yaml.constructor.ConstructorError(None, None, f"tag {node.tag} is YAML 1.1 only", node.start_mark)


for _tag in ("timestamp", "set", "omap", "pairs", "merge", "value"):
    StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _yaml_1_1_only)


def error_line(e: yaml.YAMLError, where: str, text: str = "") -> str:
    """A YAML error as one line: `where:LINE:COL: problem (context at LINE:COL)`; syntax errors say
    'not valid YAML', the refusals of StrictLoader (duplicate key, non-string key, number form) do not."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    if not isinstance(e, yaml.constructor.ConstructorError):  # the text breaks YAML's syntax
        problem = f"not valid YAML: {problem}"
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (NUL, control bytes): no mark
        problem = f"not valid YAML: character {chr(e.character)!r} is not allowed"
        line, col = text.count("\n", 0, e.position) + 1, e.position - text.rfind("\n", 0, e.position)
        mark = yaml.Mark(where, e.position, line - 1, col - 1, None, None)
    text = f"{where}:{mark.line + 1}:{mark.column + 1}: {problem}" if mark else f"{where}: {problem}"
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context:
        text += f" ({context}{f' at {cmark.line + 1}:{cmark.column + 1}' if cmark else ''})"
    return " ".join(text.split())


def parse_value(raw: str, where: str) -> Any:
    """An override's value as strict YAML ('' is null); errors name `where` (the command-line word)."""
    if raw == "":
        return None
    try:
        return yaml.load(raw, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: {error_line(e, 'value', raw)}") from None
    except RecursionError:
        raise ConfigError(f"{where}: {TOO_DEEP}") from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(mode: int) -> str | None:
    """What a non-regular file is ('a FIFO', ...), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a config file; anything but a regular text file is refused (see the module doc)."""
    try:
        st = os.stat(path)  # before any open: opening a FIFO for reading blocks until a writer comes
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror}") from None
    kind = not_regular(st.st_mode)
    if kind:
        hint = "; give a YAML file" if kind == "a directory" else ""
        raise ConfigError(f"{what} {path} is {kind}, not a regular file{hint}")
    if st.st_size > MAX_BYTES:
        raise ConfigError(f"{what} {path} is {st.st_size} bytes; a config is YAML text of at most {MAX_BYTES}")
    try:  # O_NONBLOCK: should the path have become a FIFO since the stat, the open does not wait
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind:
            raise ConfigError(f"{what} {path} is {kind}, not a regular file")
        data = f.read(MAX_BYTES + 1)
    try:
        return data[:MAX_BYTES].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not a YAML text file (byte {e.start} is not UTF-8)") from None


def read_mapping(path: str | Path, what: str, needs: str) -> dict:
    """The mapping a YAML config file holds; `needs` says what it should hold (for the messages)."""
    text = read_text(path, what)
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(error_line(e, str(path), text)) from None
    except RecursionError:
        raise ConfigError(f"{what} {path}: {TOO_DEEP}") from None
    if data is None:
        raise ConfigError(f"{what} {path} is empty; it needs {needs}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of {needs}, got a {type(data).__name__}")
    return data
