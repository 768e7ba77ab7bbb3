"""The package's import structure: imports run one way, no module imports another that imports it back.

Read from the source (ast), so the test sees every module-level and function-level import, except those
under `if TYPE_CHECKING:` (annotations only, never executed).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tp_runtime"

# part -> parts it must not import (by module prefix under tp_runtime)
FORBIDDEN = {
    "graphs": ["model", "ops", "weights", "executor", "engine", "parallel", "verify", "bench", "cli", "config"],
    "ops": ["model", "weights", "executor", "engine", "parallel", "verify", "bench", "cli", "graphs"],
    "model": ["executor", "engine", "weights", "verify", "bench", "cli", "parallel.launcher", "parallel.ray_launch"],
    "weights": ["executor", "engine", "verify", "bench", "cli", "parallel.launcher", "parallel.ray_launch"],
    "parallel": ["model", "ops", "weights", "executor", "engine", "verify", "bench", "cli"],
    "executor": ["engine", "verify", "bench", "serving", "cli"],
    "engine": ["verify", "bench", "serving", "cli"],
    "verify": ["bench", "serving", "cli"],
    "bench": ["serving", "cli"],
    "serving": ["verify", "cli"],
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def project_imports() -> dict[str, set[str]]:
    """tp_runtime module -> the tp_runtime modules it imports at run time."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tp_runtime."):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("tp_runtime.")}
        graph[_module_name(path)] = deps
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


def test_no_import_cycle():
    graph = project_imports()
    assert len(graph) > 30, "the walk found too few modules; is PACKAGE right?"
    assert _cycles(graph) == []


def test_imports_run_one_way():
    bad = []
    for mod, deps in project_imports().items():
        part = mod.removeprefix("tp_runtime.").split(".")[0]
        for dep in deps:
            rel = dep.removeprefix("tp_runtime.")
            if any(rel == f or rel.startswith(f + ".") for f in FORBIDDEN.get(part, [])):
                bad.append(f"{mod} imports {dep}")
    assert bad == []


def test_cycle_finder_finds_a_cycle():
    # The checker itself can fail: a planted two-module circle is reported.
    assert _cycles({"a": {"b"}, "b": {"a"}}) != []
    assert _cycles({"a": {"b"}, "b": set()}) == []
