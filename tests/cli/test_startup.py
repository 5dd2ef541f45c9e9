"""`cli/_startup.py`: a command's first import of torch runs without the cyclic collector and freezes what it made;
once torch is in (tests, a second command in one process) the collector is left as it is."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from cli._startup import imports_frozen

ROOT = Path(__file__).resolve().parents[2]


def test_the_first_import_of_torch_is_frozen_and_the_collector_back_on():
    code = ("import gc\nfrom cli._startup import imports_frozen\nwith imports_frozen():\n    off = not gc.isenabled()\n"
            "    import torch\nprint(off, gc.isenabled(), gc.get_freeze_count() > 100_000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["True", "True", "True"]


def test_with_torch_imported_nothing_is_frozen():
    assert "torch" in sys.modules  # conftest
    frozen = gc.get_freeze_count()
    with imports_frozen():
        assert gc.isenabled()
        import colorsys  # noqa: F401 - any import: nothing it or the process made is frozen
    assert gc.get_freeze_count() == frozen and gc.isenabled()
