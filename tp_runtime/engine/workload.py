"""What a run processes: requests (prompt and decode lengths) and each token's input hidden state.

Inputs are either derived from (seed, request, position) by a counter-based hash, identical on every
rank, device, tp and launcher, or read from a user's safetensors file. A step's rows reach the device
through pinned buffers copied without waiting (`input_staging.py`). File format (README):
`input.{i}` [prompt_len_i + decode_len_i, hidden_size] floating, for i = 0..R-1, and `prompt_len`
int64 [R]. `dump` writes the same keys plus `output.{i}` [L_i, hidden_size] float32.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tp_runtime.config import RunConfig
from tp_runtime.config_yaml import not_regular
from tp_runtime.engine.input_error import InputError
from tp_runtime.engine.input_staging import InputStaging
from tp_runtime.executor.plan import StepPlan
from tp_runtime.paths import atomic_output
from tp_runtime.weights.seeded import token_rows


@dataclass(frozen=True)
class Request:
    id: int
    prompt_len: int
    decode_len: int

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.decode_len


class Workload:
    def __init__(self, requests: list[Request], hidden: int, seed: int,
                 inputs: dict[int, torch.Tensor] | None = None):
        self.requests, self.hidden, self.seed, self._inputs = requests, hidden, seed, inputs
        self._staging: dict[torch.device, InputStaging] = {}  # per device its pinned ring (CUDA), made on first use

    def step_inputs(self, plan: StepPlan, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Input rows [T, hidden] of a step, in the plan's token order: a new tensor on `device`, made
        without waiting on it (`input_staging.py`: host data through pinned buffers, rows drawn there)."""
        staging = self._staging.get(device)
        if staging is None:
            staging = self._staging[device] = InputStaging(device, self.hidden)
        if self._inputs is not None:
            return staging.rows([self._inputs[c.request][c.start: c.start + c.length] for c in plan.chunks], dtype)
        return staging.seeded(self.seed, plan, dtype)

    @property
    def input_wait_s(self) -> float:
        """Seconds `step_inputs` waited for a pinned buffer to be free (the host was a ring's depth ahead)."""
        return sum(s.wait_s for s in self._staging.values())

    def request_inputs(self, r: Request, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """All input rows [L, hidden] of one request (the oracle's and the dump's view)."""
        if self._inputs is not None:
            return self._inputs[r.id].to(device=device, dtype=dtype)
        pos = torch.arange(r.total_len, device=device)
        return token_rows(self.seed, torch.full_like(pos, r.id), pos, self.hidden).to(dtype)


def build_workload(cfg: RunConfig) -> Workload:
    w, hidden = cfg.workload, cfg.model.hidden_size
    if w.inputs:
        requests, inputs = read_inputs(w.inputs, hidden)
        return Workload(requests, hidden, w.seed, inputs)
    rng = random.Random(w.seed)
    prompts = w.prompt_lens or [rng.randint(*w.prompt_len) for _ in range(w.requests)]
    decodes = w.decode_lens or [rng.randint(*w.decode_len) for _ in range(w.requests)]
    return Workload([Request(i, p, d) for i, (p, d) in enumerate(zip(prompts, decodes))], hidden, w.seed)


def read_inputs(path: str, hidden: int) -> tuple[list[Request], dict[int, torch.Tensor]]:
    """Load and validate a user's input file; every problem names the tensor and the file. Anything but a regular
    file (a FIFO would block the reader forever) is refused before it is opened."""
    try:
        kind = not_regular(os.stat(path).st_mode)
        if kind:
            raise InputError(f"workload.inputs: {path} is {kind}, not a regular file")
        tensors = load_file(path)
    except (FileNotFoundError, SafetensorError, OSError) as e:
        raise InputError(f"workload.inputs: cannot read {path}: {e}") from None
    if "prompt_len" not in tensors:
        raise InputError(f"{path}: missing tensor 'prompt_len' (int64 [R], one prompt length per request)")
    plens = tensors.pop("prompt_len")
    if plens.dim() != 1 or plens.dtype not in (torch.int32, torch.int64):
        raise InputError(f"{path}: 'prompt_len' must be int64 [R], got {plens.dtype} {list(plens.shape)}")
    expected = {f"input.{i}" for i in range(plens.numel())}
    # A dump (which adds output.{i} and request_id) reads back as an input file.
    names = {k for k in tensors if not k.startswith("output.") and k != "request_id"}
    if names != expected:
        extra, missing = sorted(names - expected), sorted(expected - names)
        raise InputError(f"{path}: tensors must be input.0..input.{plens.numel() - 1} and prompt_len; "
                         f"missing {missing}, unexpected {extra}")
    requests, inputs = [], {}
    for i, p in enumerate(plens.tolist()):
        x = tensors[f"input.{i}"]
        if not x.is_floating_point():
            raise InputError(f"{path}: 'input.{i}' has dtype {x.dtype}; inputs must be floating point")
        if x.dim() != 2 or x.shape[1] != hidden:
            raise InputError(f"{path}: 'input.{i}' has shape {list(x.shape)}, expected [L, {hidden}] "
                             f"(model.hidden_size = {hidden})")
        if not 1 <= p <= x.shape[0]:
            raise InputError(f"{path}: prompt_len[{i}] = {p} must lie in [1, {x.shape[0]}] (rows of input.{i})")
        x = x.float()  # first: isfinite has no float8 kernel, and float32 holds every float8 value exactly
        if not torch.isfinite(x).all():
            raise InputError(f"{path}: 'input.{i}' holds NaN or infinite values (as float32, the inputs' precision)")
        requests.append(Request(i, p, x.shape[0] - p))
        inputs[i] = x
    return requests, inputs


def write_dump(path: str, workload: Workload, outputs: dict[int, torch.Tensor]) -> None:
    """Write inputs and outputs of every completed request, in the input file's format plus output.{i}."""
    done = [r for r in workload.requests if r.id in outputs]
    tensors = {"prompt_len": torch.tensor([r.prompt_len for r in done], dtype=torch.long)}
    for j, r in enumerate(done):
        tensors[f"input.{j}"] = workload.request_inputs(r, torch.device("cpu"), torch.float32).contiguous()
        tensors[f"output.{j}"] = outputs[r.id].float().cpu().contiguous()
    tensors["request_id"] = torch.tensor([r.id for r in done], dtype=torch.long)
    with atomic_output(path) as tmp:  # replaces only a regular file, and only once the whole file is written
        save_file(tensors, str(tmp))
