"""The layers: no import circle in specgen/ or cli/, among module-level imports, function-local ones, or imports by
name (`importlib.import_module("...")`, `__import__("...")`, and module names held in strings, such as a dict of
runner modules resolved by import); and the registry store imports no model, training or evaluation code (it is the
lowest layer; `checkpoints` builds modules above it). A derived built-in (the merged pcLLM target) is made by a
maker registered from above (`builtins.DERIVERS`) instead of naming code above the table, so a circle fails here."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specgen"
PACKAGES = (PACKAGE, ROOT / "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named_module(text: str, modules: set[str]) -> str | None:
    """The module a string names: "pkg.mod" or "pkg.mod:function" (a string import), else None."""
    name = text.split(":")[0]
    return name if name in modules else None


@functools.cache
def parsed(path: Path) -> tuple[list[str], ast.Module]:
    """The file's lines and syntax tree, read once per session (every check below walks the same files)."""
    text = path.read_text()
    return text.splitlines(), ast.parse(text)


def imports_of(path: Path, modules: set[str], everywhere: bool = False) -> set[str]:
    """Modules of specgen/cli a file imports at module level (or anywhere: function-local imports and modules named
    in strings, which `importlib.import_module`, `__import__` or a table of runners import, included)."""
    found = set()
    tree = parsed(path)[1]
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for n in ast.walk(block)}  # `if TYPE_CHECKING:` imports never run
    for node in (ast.walk(tree) if everywhere else tree.body):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [named_module(node.value, modules) or ""]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


@functools.cache
def graph(everywhere: bool = False) -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in package.rglob("*.py")}
    return {m: imports_of(p, set(files), everywhere) - {m, "specgen", "cli"} for m, p in files.items()}


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_module_level_imports_form_no_circle():
    assert circles(graph()) == []


def test_function_local_and_string_imports_close_no_circle_either():
    assert circles(graph(everywhere=True)) == []


def package_of(module: str) -> str:
    """The layer a module lives in: its folder under specgen/ (`specgen.image`), a top-level module, or `cli`."""
    parts = module.split(".")
    return "cli" if parts[0] == "cli" else ".".join(parts[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """`edges` between modules as edges between their packages (package_of); a package's own imports dropped."""
    out: dict[str, set[str]] = {package_of(m): set() for m in edges}
    for m, targets in edges.items():
        out[package_of(m)] |= {package_of(t) for t in targets} - {package_of(m)}
    return out


def test_packages_form_no_circle_either():
    """Layers, not only modules: no package imports one that imports it back (the modality runs in generate/ sit
    above the methods, which sit above the modalities' targets and tokenizers in image/ and mesh/)."""
    assert circles(package_graph(graph(everywhere=True))) == []


def test_a_package_circle_is_found():
    modules = {"specgen.a.x": {"specgen.b.y"}, "specgen.b.y": set(), "specgen.b.z": {"specgen.a.w"},
               "specgen.a.w": set()}  # no module circle: a -> b at x, b -> a at z
    assert circles(package_graph(modules)) == [{"specgen.a", "specgen.b"}]


def test_string_imports_are_edges():
    """A module named in a string (a table of modules, `importlib.import_module("...")`) is seen as imported."""
    edges = graph(everywhere=True)
    assert "specgen.train.distill" in edges["specgen.eval.dry_run"]  # its table of recipe kinds


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_the_registry_store_imports_only_errors_and_paths():
    allowed = {"specgen", "specgen.errors", "specgen.paths"}
    tree = ast.parse((PACKAGE / "registry.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("specgen")} <= allowed  # function-local imports included


def test_the_registry_loads_alone_in_a_fresh_interpreter(fresh_interpreter):
    assert fresh_interpreter["registry"] == ["specgen", "specgen.errors", "specgen.paths", "specgen.registry"]


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(graph()))
def test_every_module_imports_on_its_own(module):
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, check=True, capture_output=True)


#: Function-local imports allowed in specgen/ and cli/ (issue 45): optional dependencies and start-up cost only.
LOCAL_IMPORTS_CAP = 51  # 60 until session 84: to_hf's 13 transformers imports are one (`hf_export.built`)


def local_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, explained) of each import inside a function or class of the file (`if TYPE_CHECKING:` ones excluded).
    Explained: a comment on its line, on a line of the run of imports it starts or continues, or on the line above."""
    lines, tree = parsed(path)
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING" for n in ast.walk(block)}
    nested = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              and n not in tree.body and id(n) not in typing_only]
    out = []
    for node in nested:
        first = node.lineno
        while first > 1 and lines[first - 2].strip().startswith(("import ", "from ")):
            first -= 1  # the run of imports this one belongs to
        out.append((node.lineno, any("#" in lines[i - 1] for i in range(max(first - 1, 1), node.end_lineno + 1))))
    return out


def test_function_local_imports_are_few_and_each_says_why():
    found = {f"{p.relative_to(ROOT)}:{line}": why for package in PACKAGES for p in package.rglob("*.py")
             for line, why in local_imports(p)}
    assert [place for place, why in found.items() if not why] == []
    assert len(found) <= LOCAL_IMPORTS_CAP


def test_an_unexplained_local_import_is_found(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def a():\n    import json  # optional\n    import os\n\n\ndef b():\n    import re\n")
    assert local_imports(f) == [(2, True), (3, True), (7, False)]


def test_the_generate_dispatch_loads_no_modality_stack_until_one_is_picked(fresh_interpreter):
    """A text `generate` imports neither the image nor the mesh runner (their stacks cost start-up time and memory)."""
    assert fresh_interpreter["stacks"] == []


def test_the_size_check_builds_every_shipped_model_on_meta_without_importing_dynamo(fresh_interpreter):
    """`declared_params` builds each module on the meta device at every load, and a quantized load its int4 module
    and the shapes of its kernel operands; a constructor computing values there (a norm, a power, a cat) runs Python
    meta kernels that import torch._dynamo (and Triton where installed: ~1 s and ~0.1 GB of start-up). Control: one
    such op (dynamo: before the builds, after them, before the control, after it)."""
    assert fresh_interpreter["dynamo"] == [False, False, False, True]
