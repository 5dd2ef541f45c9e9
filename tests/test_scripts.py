"""Every script in scripts/ (the GPU check's steps among them) still imports against today's specgen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPORT_ALL = """
import importlib.util, pathlib, sys
for folder in map(pathlib.Path, sys.argv[1:]):
    sys.path.insert(0, str(folder))  # scripts import their neighbours by name
    for path in sorted(folder.glob("*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        sys.modules[path.stem] = module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # a script's work runs under `__main__` only
        except Exception as e:
            print(f"{folder.name}/{path.name}: {type(e).__name__}: {e}")
"""


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> list[str]:
    """Scripts that failed to import, of scripts/ and of a folder holding one stale script (the control), in one
    interpreter: a launch pays torch's import, and the control's folder is read after scripts/ is done."""
    stale = tmp_path_factory.mktemp("stale", numbered=False)
    (stale / "stale.py").write_text("from specgen.decoding.loop import no_such_name\n")
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(ROOT / "scripts"), str(stale)], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    return out.splitlines()


def test_every_script_imports(broken):
    assert [line for line in broken if line.startswith("scripts/")] == []


def test_a_script_importing_a_name_that_went_is_reported(broken):
    assert [line.split(":")[0] for line in broken if not line.startswith("scripts/")] == ["stale/stale.py"]


@pytest.mark.slow
def test_the_graphs_step_runs_on_the_cpu_with_graphs_equal_to_eager():
    """The GPU check's main step end to end at tiny sizes (`--smoke`, which measures nothing): every row exact."""
    out = subprocess.run([sys.executable, "scripts/gpu_graphs.py", "--smoke", "--only", "text"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| text |")]
    assert len(rows) >= 4 and all(r[5].strip() in ("1.0", "") for r in rows)
