"""The process around a command: its first import of torch runs without the cyclic collector and freezes what it
made (`cli/_process.py`; once torch is in, the collector is left as it is), and it ends without the interpreter's
teardown, its exit status, output and exit handlers as with `sys.exit` (`end`)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from cli._process import end, imports_frozen

ROOT = Path(__file__).resolve().parents[2]


def test_the_first_import_of_torch_is_frozen_and_the_collector_back_on(fresh_interpreter):
    """A fresh process's first step (tests/startup_checks.py): collector off inside, back on after, torch frozen."""
    assert fresh_interpreter["frozen"] == [True, True, True]


def test_with_torch_imported_nothing_is_frozen():
    assert "torch" in sys.modules  # conftest
    frozen = gc.get_freeze_count()
    with imports_frozen():
        assert gc.isenabled()
        import colorsys  # noqa: F401 - any import: nothing it or the process made is frozen
    assert gc.get_freeze_count() == frozen and gc.isenabled()


@pytest.mark.parametrize("code, status, out, err", [
    (3, 3, "out handler", ""), (None, 0, "out handler", ""), ("bad thing", 1, "out handler", "bad thing"),
])
def test_the_quick_exit_keeps_status_output_and_exit_handlers(code, status, out, err):
    script = ("import atexit, sys\nfrom cli._process import end\natexit.register(lambda: print('handler'))\n"
              f"print('out', end=' ')\nend({code!r})")
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert (got.returncode, got.stdout.split(), got.stderr.strip()) == (status, out.split(), err)


def test_the_app_ends_with_its_status_and_one_line():
    got = subprocess.run([sys.executable, "-m", "cli.main", "generate", "--bogus"], capture_output=True, text=True,
                         cwd=ROOT)
    assert got.returncode == 2 and got.stderr.startswith("error: No such option: --bogus") and got.stdout == ""


def test_under_a_profiler_the_exit_is_the_ordinary_one():
    sys.setprofile(lambda *args: None)
    try:
        with pytest.raises(SystemExit) as exited:
            end(4)
    finally:
        sys.setprofile(None)
    assert exited.value.code == 4


@pytest.mark.parametrize("closed, args, status, err", [
    (">&-", ["--help"], 0, ""),  # the help goes nowhere, as Python's own print does with no stdout
    (">&-", ["generate", "--bogus"], 2, "error: No such option: --bogus"),
    ("2>&-", ["generate", "--bogus"], 2, ""),
    ("<&-", ["generate", "--prompts", "-"], 2, "error: <stdin>: no prompts (the input is empty)"),
])
def test_a_closed_standard_stream_is_no_traceback(closed, args, status, err):
    """`specgen ... >&-`: Python starts with sys.stdout None, which the app's import read (a traceback, exit 1)."""
    got = subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", sys.executable, "-m", "cli.main", *args],
                         capture_output=True, text=True, cwd=ROOT)
    assert (got.returncode, got.stderr.split("(see")[0].strip()) == (status, err), got.stderr
