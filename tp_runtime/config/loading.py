"""A RunConfig from a YAML file and dotted `key=value` overrides (and a checkpoint's config.json), validated.

    cfg = load_config("configs/tiny.yaml", ["parallel.tp=4", "workload.requests=16"])

Every error names the offending key, where it came from (file or command line) and what is allowed. The
config remembers where each dotted key was set (`RunConfig.origins`), so cross-field refusals name the
file or the override word that set the values they refuse.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tp_runtime.config.build import from_mapping, parse_override, set_dotted
from tp_runtime.config.checkpoint import RUN_MODEL_KEYS, merge_checkpoint_config
from tp_runtime.config.schema import RunConfig
from tp_runtime.config.validation import validate
from tp_runtime.config_yaml import read_mapping


def read_yaml(path: str | Path) -> dict:
    """The mapping a YAML config file holds; anything but a regular file holding a mapping is refused."""
    sections = [f.name for f in dataclasses.fields(RunConfig) if not f.metadata.get("internal")]
    return read_mapping(path, "config file", f"sections {sections}")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or defaults when path is None), apply overrides, validate."""
    data: dict = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        data = read_yaml(path)
    origins = _origins(data, source)  # dotted key -> where it was set
    for word in overrides or []:
        key, value = parse_override(word)
        set_dotted(data, key, value, f"override {word!r}")
        # Build once per override so an error names the command-line word rather than the file.
        from_mapping(RunConfig, data, "", f"{source} with override {word!r}")
        origins = {k: v for k, v in origins.items() if not k.startswith(key + ".")}
        origins.update(_origins({key: value}, f"override {word!r}"))
    cfg = from_mapping(RunConfig, data, "", source)
    if cfg.model.checkpoint:  # the checkpoint's config.json supplies the model keys
        model_origins = {k.split(".")[1]: v for k, v in origins.items() if k.startswith("model.")}
        path_json = merge_checkpoint_config(data["model"], model_origins)
        origins.update({f"model.{k}": str(path_json) for k in data["model"]
                        if k not in RUN_MODEL_KEYS and model_origins.get(k) is None})
        cfg = from_mapping(RunConfig, data, "", source)
    cfg.source, cfg.origins = source, origins
    validate(cfg)
    return cfg


def config_from_dict(data: dict, source: str = "<dict>") -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (how workers receive it)."""
    cfg = from_mapping(RunConfig, data, "", source)
    cfg.source = source
    validate(cfg)
    return cfg


def _origins(data: dict, source: str, prefix: str = "") -> dict[str, str]:
    """Every dotted key (and section) a mapping sets -> source."""
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        out[key] = source
        if isinstance(v, dict):
            out.update(_origins(v, source, key + "."))
    return out
