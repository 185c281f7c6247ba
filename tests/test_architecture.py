"""The dependency order hardware_profiles <- cost_models <- autoparallel holds at run time, and no
module-level import cycle exists (the style guide's contract, checked on the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware_profiles", "cost_models", "autoparallel")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules imported at module level (not under `if TYPE_CHECKING:`, not inside functions, where a
    deferred import is deliberate); `from pkg import sub` counts as importing the submodule only."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            found.update(subs or [node.module])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules}


def test_lower_layers_import_nothing_above_them():
    modules = _modules()
    rank = {pkg: i for i, pkg in enumerate(PACKAGES)}
    upward = [(name, dep) for name, path in modules.items() for dep in _runtime_imports(path, modules)
              if rank[dep.split(".")[0]] > rank[name.split(".")[0]]]
    assert upward == []


def test_no_module_level_import_cycles():
    modules = _modules()
    g = nx.DiGraph()
    for name, path in modules.items():
        g.add_node(name)
        g.add_edges_from((name, dep) for dep in _runtime_imports(path, modules) if dep != name)
    assert list(nx.simple_cycles(g)) == []
