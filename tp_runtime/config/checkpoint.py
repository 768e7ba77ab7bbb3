"""A checkpoint's config.json as the model section of a run: read, checked and merged.

With model.checkpoint set, the model keys come from the checkpoint's config.json; the YAML and the
overrides still choose layers, parallel, runtime, workload and graph settings, and a model value of
theirs that disagrees with config.json is refused (merge_checkpoint_config).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

from tp_runtime.config.build import from_mapping
from tp_runtime.config.schema import ModelConfig, RopeScaling, parse_layer_spec
from tp_runtime.config_yaml import ConfigError

CHECKPOINT_CONFIG = "config.json"
# ModelConfig keys that choose what to run, not what the model is: never taken from config.json.
RUN_MODEL_KEYS = ("layers", "checkpoint")
# Keys a checkpoint's config.json must give: they fix the tensor shapes.
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
              "q_lora_rank", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "compress_ratios")


def swapped_out(directory: Path) -> Path:
    """Where write-checkpoint keeps the previous checkpoint between the two renames that swap in a new one."""
    return directory.parent / f".{directory.name}.old"


def _not_a_directory(directory: str | Path) -> ConfigError:
    msg = (f"model.checkpoint={str(directory)!r} is not a directory (a DeepSeek-V4 checkpoint directory holds "
           "config.json, model.safetensors.index.json and model-*.safetensors)")
    previous = swapped_out(Path(directory).expanduser().absolute())
    if previous.is_dir():
        msg += (f"; {previous} holds the checkpoint a write-checkpoint was replacing when it was stopped: the next "
                "write-checkpoint into that directory puts it back first, or rename it yourself")
    return ConfigError(msg)


def read_checkpoint_config(directory: str | Path) -> tuple[dict, Path]:
    """The ModelConfig keys of a checkpoint's config.json (raw JSON values) and that file's path.

    The file's other keys (vocabulary, MoE, quantization) lie outside this project and are ignored.
    """
    path = Path(directory) / CHECKPOINT_CONFIG
    if not Path(directory).is_dir():
        raise _not_a_directory(directory)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a directory or a FIFO: refused, never opened
            raise ConfigError(f"model.checkpoint: {path} is not a regular file; a checkpoint's config.json is a "
                              "JSON file")
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model.checkpoint: {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # not JSON, not UTF-8, too deep
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ConfigError(f"model.checkpoint: {path} cannot be read ({e.strerror or e})") from None
    missing = [k for k in SHAPE_KEYS if k not in raw] if isinstance(raw, dict) else list(SHAPE_KEYS)
    if missing:
        raise ConfigError(f"{path} lacks the model keys {missing}; a DeepSeek-V4 config.json gives every shape")
    keys = {f.name for f in dataclasses.fields(ModelConfig)} - set(RUN_MODEL_KEYS)
    values = {k: raw[k] for k in keys if k in raw}
    if isinstance(values.get("rope_scaling"), dict):  # keep the YaRN keys this project reads
        known = {f.name for f in dataclasses.fields(RopeScaling)}
        values["rope_scaling"] = {k: v for k, v in values["rope_scaling"].items() if k in known}
    from_mapping(ModelConfig, values, "model", str(path))  # types checked here, so errors name config.json
    return values, path


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 16 == 16.0, lists elementwise, nested mappings key by key."""
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _agree(key: str, mine: Any, theirs: Any, origin: str, path: Path) -> None:
    if isinstance(mine, dict) and isinstance(theirs, dict):  # rope_scaling: the sub-keys both give
        for k in sorted(mine.keys() & theirs.keys()):
            _agree(f"{key}.{k}", mine[k], theirs[k], origin, path)
        return
    if not _same(mine, theirs):
        hint = " (select layers with model.layers=a-b instead)" if key == "num_hidden_layers" else ""
        raise ConfigError(f"model.{key}: {origin} sets {mine!r}, but the checkpoint's {path} has {theirs!r}; "
                          f"model shapes come from the checkpoint: drop model.{key} from the run config or "
                          f"make it agree{hint}")


def merge_checkpoint_config(model: dict, origins: dict[str, str]) -> Path:
    """Fill a raw model section from the checkpoint's config.json, in place (load_config calls this);
    returns that config.json's path.

    config.json decides every model key it gives; a YAML or override value that disagrees is an error
    naming the key, both values and both files (`origins`: key -> where the run's value came from).
    The run keys (layers, checkpoint) stay the run's; the layer selection must lie inside the checkpoint.
    """
    directory = Path(str(model["checkpoint"])).expanduser().resolve()
    values, path = read_checkpoint_config(directory)
    model["checkpoint"] = str(directory)  # absolute: ranks may start in another working directory
    for key, theirs in values.items():
        if key in model:
            _agree(key, model[key], theirs, origins.get(key, "the run config"), path)
            if isinstance(model[key], dict) and isinstance(theirs, dict):
                theirs = {**model[key], **theirs}
        model[key] = theirs
    if model.get("layers") is not None:
        try:
            parse_layer_spec(model["layers"], values["num_hidden_layers"])
        except ConfigError as e:
            raise ConfigError(f"{origins.get('layers', 'the run config')}: {e} ({path} has "
                              f"num_hidden_layers={values['num_hidden_layers']})") from None
    return path


def checkpoint_disagreements(model: ModelConfig, directory: str | Path) -> tuple[list[str], Path]:
    """Where a built ModelConfig differs from the checkpoint's config.json, as 'key: run X, checkpoint Y'."""
    values, path = read_checkpoint_config(directory)
    ckpt = from_mapping(ModelConfig, values, "model", str(path))
    diffs = [f"model.{k}: the run has {getattr(model, k)!r}, the checkpoint {getattr(ckpt, k)!r}"
             for k in sorted(values) if getattr(model, k) != getattr(ckpt, k)]
    return diffs, path
