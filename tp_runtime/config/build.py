"""Raw mappings -> config dataclasses, every key, type and choice checked; dotted `key=value` overrides.

The run config's loader uses these, and so do the sweep readers (bench and serve-bench), whose own sections
are dataclasses of the same kind:

    set_dotted(data, *parse_override("parallel.tp=4"), "override 'parallel.tp=4'")
    cfg = from_mapping(RunConfig, data, "", "configs/tiny.yaml")
    settings = from_mapping(BenchSettings, raw["bench"], "bench", "configs/bench_tiny.yaml")

Every error is a ConfigError naming the source, the dotted key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from tp_runtime.config_yaml import ConfigError, parse_value

T = TypeVar("T")


def parse_override(word: str) -> tuple[str, Any]:
    """'parallel.tp=4' -> ('parallel.tp', 4); the value is read as strict YAML 1.2 (config_yaml.py)."""
    key, sep, raw = word.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {word!r} is not of the form section.key=value")
    return key.strip(), parse_value(raw, f"override {word!r}")


def set_dotted(data: dict, key: str, value: Any, source: str) -> None:
    """Set the dotted `key` ('runtime.max_seqs') of a raw nested mapping to `value`, in place, making the
    sections on the way; `source` names the setting in the error when a part of the path is not a section."""
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{key}' descends into '{p}', which is not a section")
        node = child
    node[parts[-1]] = value


def from_mapping(cls: type[T], data: Any, prefix: str, source: str) -> T:
    """The dataclass `cls` built from the raw mapping `data`: unknown keys, wrong types and values outside a
    field's `choices` are refused; ints are accepted where floats are expected. `prefix` is the dotted key of
    `data` itself ('' for a whole RunConfig, 'bench' for a sweep's own section), `source` where it was read."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix or '<top>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields), key=str)  # keys of any type (a dict built in code)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"{source}: unknown key '{where}{unknown[0]}'; allowed keys under '{prefix or '<top>'}': {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        choices = fields[name].metadata.get("choices")
        kwargs[name] = _coerce(value, hints[name], key, source)  # YAML 1.2: a bare on / off is a string
        if choices and kwargs[name] not in choices:
            raise ConfigError(f"{source}: '{key}' must be one of {choices}, got {kwargs[name]!r}")
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), key, source)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{key}' must be a list of {_type_name(item)}, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, key, source)
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[tp]
    if not ok:
        raise ConfigError(f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return float(value) if tp is float else value


def _coerce_union(value: Any, args: tuple, key: str, source: str) -> Any:
    """`value` as the first member of an `X | Y | None` annotation that accepts it."""
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
        return _coerce(value, inner[0], key, source)
    for a in inner:
        try:
            return _coerce(value, a, key, source)
        except ConfigError:
            pass
    raise ConfigError(f"{source}: '{key}' must be {' or '.join(map(_type_name, inner))}, "
                      f"got {type(value).__name__} {value!r}")
