"""Run configuration: YAML file + dotted `key=value` overrides -> typed, validated dataclasses.

    cfg = load_config("configs/tiny.yaml", ["parallel.tp=4", "workload.requests=16"])

Model keys carry the names of DeepSeek-V4's config.json, so a released config reads directly; with
model.checkpoint set, the model keys come from the checkpoint's config.json. The parts:

    schema.py         the sections as dataclasses (defaults, types, choices); layer lists; implied sizes
    build.py          raw mappings -> dataclasses, every key checked; dotted overrides (the sweep readers' too)
    checkpoint.py     a checkpoint's config.json: read, checked, merged into the model section
    loading.py        load_config, config_from_dict: YAML + overrides (+ config.json) -> a validated RunConfig
    validation.py     cross-field checks, section by section; the eagerly-run-steps warning
    device_checks.py  what the device must support (Triton kernels, PDL, FP8 weights and caches): before any
                      rank starts, on this machine, and on a rank's own device

The rest of the project imports from here (`from tp_runtime.config import ...`), never from the parts.
"""

# ConfigError is defined beside the YAML reader (which raises it too, and which imports nothing of the project).
from tp_runtime.config.build import from_mapping, parse_override, set_dotted
from tp_runtime.config.checkpoint import (CHECKPOINT_CONFIG, RUN_MODEL_KEYS, SHAPE_KEYS, checkpoint_disagreements,
                                          merge_checkpoint_config, read_checkpoint_config, swapped_out)
from tp_runtime.config.device_checks import check_machine, uses_fp8_cache, uses_fp8_weights
from tp_runtime.config.loading import config_from_dict, load_config, read_yaml
from tp_runtime.config.schema import (GraphConfig, ModelConfig, ParallelConfig, RopeScaling, RunConfig, RuntimeConfig,
                                      WorkloadConfig, breakable_sizes, compressed_len, parse_layer_spec)
from tp_runtime.config.validation import MAX_TIMEOUT_S, eager_steps_warning, validate
from tp_runtime.config_yaml import ConfigError

__all__ = [
    "CHECKPOINT_CONFIG", "MAX_TIMEOUT_S", "RUN_MODEL_KEYS", "SHAPE_KEYS", "ConfigError", "GraphConfig", "ModelConfig",
    "ParallelConfig", "RopeScaling", "RunConfig", "RuntimeConfig", "WorkloadConfig", "breakable_sizes",
    "check_machine", "checkpoint_disagreements", "compressed_len", "config_from_dict", "eager_steps_warning",
    "from_mapping", "load_config", "merge_checkpoint_config", "parse_layer_spec", "parse_override",
    "read_checkpoint_config", "read_yaml", "set_dotted", "swapped_out", "uses_fp8_cache", "uses_fp8_weights",
    "validate",
]
