"""The static decode path a full graph captures (graph.mode full / full_and_breakable), on the CPU.

On a CPU the full modes warn and run that path eagerly, so these tests check what a GPU replays: every
candidate set sized by the config (W window rows, K picks among max_len / 4 indexer keys, all
max_len / 128 compressed rows) and masked on the device by each token's live counts, against the
dynamic eager path whose sizes come from the step. GPU replay of the same path: tests/test_full_graph_gpu.py.
"""

from __future__ import annotations


import pytest

from conftest import TINY_PATH as TINY, last_json, run_cli, with_settings
from tp_runtime.config import ConfigError, load_config
from tp_runtime.engine.entry import in_process, launch
from tp_runtime.verify.check import TOLERANCES, max_rel_err

# float32 (configs/tiny.yaml). The static path adds masked candidates, which weigh exactly 0, so only the
# reduction order of longer sums differs: float32 rounding, far below TOLERANCES' 1e-5.
TOL = TOLERANCES["float32"]

# Decode positions that cover the edge cases (tiny: W = 16, K = 8, ratios 4 and 128, max_len 512):
# context 1; a window partly filled; no compressed entry yet (< 4 tokens); fewer than K indexer keys
# (< 32 tokens); crossing 4- and 128-token boundaries (126..130); and contexts far past anything at
# capture time (400.., 505..510). All prompts are prefilled in the first step, so every later step is
# decode-only and takes the static path.
PROMPTS = [1, 3, 14, 30, 126, 127, 400, 505]
DECODES = [6, 6, 6, 6, 5, 4, 6, 6]
EDGES = ["runtime.device=cpu", f"workload.requests={len(PROMPTS)}", f"workload.prompt_lens={PROMPTS}",
         f"workload.decode_lens={DECODES}", f"runtime.max_seqs={len(PROMPTS)}", "runtime.max_len=512",
         "runtime.max_tokens_per_step=1300", "runtime.prefill_chunk=512"]


def test_full_modes_are_accepted_and_others_refused():
    for mode in ("full", "full_and_breakable"):
        assert load_config(TINY, [f"graph.mode={mode}"]).graph.mode == mode
    with pytest.raises(ConfigError, match="graph.mode.*full_and_breakable"):
        load_config(TINY, ["graph.mode=fullgraph"])


@pytest.mark.parametrize("mode", ["full", "full_and_breakable"])
def test_static_decode_path_equals_the_dynamic_one_at_every_edge(mode):
    cfg = load_config(TINY, ["parallel.tp=1", f"graph.mode={mode}", *EDGES])
    with pytest.warns(UserWarning, match=f"graph.mode={mode} needs a CUDA device"):
        full = in_process(cfg, keep_outputs=True)
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    assert full.steps_by_path == {"eager": 1, "full": max(DECODES)}  # one prefill step, then decode-only
    assert full.replayed_steps == 0 and full.graph == {}
    assert eager.steps_by_path == {"eager": 1 + max(DECODES)}
    err = max_rel_err(full.outputs, eager.outputs)
    assert err <= TOL, err
    assert full.completed == len(PROMPTS)


def test_static_decode_path_at_tp2():
    cfg = load_config(TINY, ["parallel.tp=2", "parallel.launcher=local", "graph.mode=full", *EDGES])
    full = launch(cfg, keep_outputs=True)
    tp1_cfg = with_settings(load_config(TINY, ["parallel.tp=1", *EDGES]), "graph", mode="eager")
    tp1 = in_process(tp1_cfg, keep_outputs=True)
    assert full.steps_by_path["full"] == max(DECODES)
    err = max_rel_err(full.outputs, tp1.outputs)
    assert err <= TOL, err


def test_mixed_steps_take_the_dynamic_path():
    # The default workload mixes prefill chunks with decodes: those steps run eagerly, the rest static.
    cfg = load_config(TINY, ["parallel.tp=1", "runtime.device=cpu", "graph.mode=full"])
    with pytest.warns(UserWarning):
        full = in_process(cfg, keep_outputs=True)
    eager = in_process(with_settings(cfg, "graph", mode="eager"), keep_outputs=True)
    assert full.steps_by_path["eager"] > 0 and full.steps_by_path["full"] > 0
    assert sum(full.steps_by_path.values()) == full.steps == eager.steps
    assert max_rel_err(full.outputs, eager.outputs) <= TOL


def test_check_compares_full_with_eager():
    proc = run_cli(["check", TINY, "parallel.tp=1", "parallel.launcher=local", "graph.mode=full",
                    "runtime.device=cpu", "workload.requests=4"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = last_json(proc.stdout)
    assert rec["ok"] and rec["comparisons"]["full_vs_eager"]["max_rel_err"] <= TOL
    assert rec["steps_by_path"]["full"] > 0
