"""Every script in scripts/ (the GPU check's steps among them) still imports against today's specgen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_script_imports(fresh_interpreter):
    assert [line for line in fresh_interpreter["scripts"] if line.startswith("scripts/")] == []


def test_a_script_importing_a_name_that_went_is_reported(fresh_interpreter):
    """The control: a folder holding one stale script, read in the same interpreter after scripts/."""
    assert [line.split(":")[0] for line in fresh_interpreter["scripts"] if not line.startswith("scripts/")] == [
        "stale/stale.py"]


@pytest.mark.slow
def test_the_graphs_step_runs_on_the_cpu_with_graphs_equal_to_eager():
    """The GPU check's main step end to end at tiny sizes (`--smoke`, which measures nothing): every row exact."""
    out = subprocess.run([sys.executable, "scripts/gpu_graphs.py", "--smoke", "--only", "text"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| text |")]
    assert len(rows) >= 4 and all(r[5].strip() in ("1.0", "") for r in rows)
