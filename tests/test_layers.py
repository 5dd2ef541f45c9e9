"""The package's layers: no import circle among module-level imports, and the registry store imports no model,
training or evaluation code (it is the lowest layer; `checkpoints` builds modules above it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specgen"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """specgen modules a file imports at module level (function-local imports are resolved at call time)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: top_level_imports(p, set(files)) - {m} for m, p in files.items()}


def test_module_level_imports_form_no_circle():
    edges, state, cycles = graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import circles: {cycles[:3]}"


def test_the_registry_store_imports_only_errors_and_paths():
    allowed = {"specgen", "specgen.errors", "specgen.paths"}
    tree = ast.parse((PACKAGE / "registry.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("specgen")} <= allowed  # function-local imports included


def test_the_registry_loads_alone_in_a_fresh_interpreter():
    code = ("import sys, specgen.registry; print(sorted(m for m in sys.modules if m.startswith('specgen')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert eval(out) == ["specgen", "specgen.errors", "specgen.registry"]


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(graph()))
def test_every_module_imports_on_its_own(module):
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, check=True, capture_output=True)
