"""The package's import structure: imports run one way, no module imports another that imports it back.

Read from the source (ast), so the test sees every import: module-level, function-level and those under
`if TYPE_CHECKING:` (an annotation that needs an upper layer's type names a type in the wrong layer).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tp_runtime"

# The top-level modules and parts every lower one must not import.
_ENTRY = ["cli", "engine", "serving", "verify", "bench", "sweep_file", "optional_plots"]
_TOP_LEVEL = _ENTRY + ["memory_fit", "memory_model"]
_BELOW_CONFIG = _TOP_LEVEL + ["graphs", "model", "ops", "weights", "executor", "parallel", "paths"]
# kernels take plain values; a refusal raises ConfigError from config_yaml, a bottom module like capability
_OPS = [p for p in _BELOW_CONFIG if p != "ops"] + ["config"]

# module or part -> parts and modules it must not import (by module prefix under tp_runtime); a module follows
# the most specific entry that covers it.
FORBIDDEN = {
    "capability": _BELOW_CONFIG + ["config", "config_yaml"],  # device probes: nothing of the project
    "config_yaml": _BELOW_CONFIG + ["config", "capability"],
    "config": _BELOW_CONFIG,
    "graphs": [p for p in _BELOW_CONFIG if p != "graphs"] + ["config", "config_yaml"],
    "paths": [p for p in _BELOW_CONFIG if p != "paths"],  # output paths and the one file writer: config only
    "ops": _OPS,
    "ops.index": _OPS + ["ops"],  # the kernels' argument types: nothing of the project but torch
    "model": _TOP_LEVEL + ["executor", "weights", "parallel.launcher", "parallel.ray_launch"],
    "weights": _TOP_LEVEL + ["executor", "parallel.launcher", "parallel.ray_launch"],
    "memory_model": _TOP_LEVEL + ["executor", "parallel"],
    "memory_fit": _ENTRY + ["executor", "parallel"],
    "parallel": _TOP_LEVEL + ["model", "ops", "weights", "executor"],
    "executor": _ENTRY + ["memory_fit"],
    "engine": ["verify", "bench", "serving", "cli"],
    "verify": ["bench", "serving", "cli"],
    "bench": ["serving", "cli"],
    "serving": ["verify", "cli"],
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The tp_runtime modules one import statement names: `import a.b`, `from a.b import c` (a.b, and a.b.c
    where c is a module), relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return {base} | {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}


@functools.cache  # the tests below only read it
def project_imports() -> dict[str, set[str]]:
    """tp_runtime module -> the tp_runtime modules it imports, anywhere in its source (TYPE_CHECKING too)."""
    modules = _modules()
    known = set(modules)
    graph = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(tree):
            deps |= {d for d in _imported(node, mod, is_package, known)
                     if d == "tp_runtime" or d.startswith("tp_runtime.")}
        graph[mod] = deps - {mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, found = {}, []

    def visit(u: str, path: list[str]) -> None:
        state[u] = "open"
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(path[path.index(v):] + [u, v] if v in path else [u, v])
            elif v in graph and v not in state:
                visit(v, path + [u])
        state[u] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def _rule(rel: str) -> list[str]:
    """The forbidden prefixes of the most specific FORBIDDEN entry covering module rel (under tp_runtime)."""
    keys = [k for k in FORBIDDEN if rel == k or rel.startswith(k + ".")]
    return FORBIDDEN[max(keys, key=len)] if keys else []


def _upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        forbidden = _rule(mod.removeprefix("tp_runtime."))
        for dep in sorted(deps):
            rel = dep.removeprefix("tp_runtime.")
            if any(rel == f or rel.startswith(f + ".") for f in forbidden):
                bad.append(f"{mod} imports {dep}")
    return bad


def test_no_import_cycle():
    graph = project_imports()
    assert len(graph) > 30, "the walk found too few modules; is PACKAGE right?"
    assert _cycles(graph) == []


def test_imports_run_one_way():
    assert _upward(project_imports()) == []


def test_every_rule_names_a_part_that_exists():
    # A renamed or split module must not silently leave its rule behind.
    modules = {m.removeprefix("tp_runtime.") for m in project_imports()}
    for name in set(FORBIDDEN) | {f for fs in FORBIDDEN.values() for f in fs}:
        assert any(m == name or m.startswith(name + ".") for m in modules), name


def test_the_checks_find_what_they_look_for():
    # The checker itself can fail: a planted two-module circle is reported, a type-only import is seen, and an
    # upward import follows the most specific rule.
    assert _cycles({"a": {"b"}, "b": {"a"}}) != []
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tp_runtime.model.cache import X\n"
                     "def f():\n    from . import step_index\n")
    found = set().union(*(_imported(n, "tp_runtime.ops.select", False, {"tp_runtime.ops.step_index"})
                          for n in ast.walk(tree)))
    assert {"tp_runtime.model.cache", "tp_runtime.ops.step_index"} <= found
    assert _upward({"tp_runtime.ops.index": {"tp_runtime.ops.cache_fp8"}}) != []
    assert _upward({"tp_runtime.ops.select": {"tp_runtime.ops.cache_fp8"}}) == []
    assert _upward({"tp_runtime.ops.select": {"tp_runtime.model.cache"}}) != []
