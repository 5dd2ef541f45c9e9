"""Measurements kept on disk per machine and torch (`decoding/cost.py`'s cost curves in `$SPECGEN_HOME/plans/`)."""

from __future__ import annotations

import functools
import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Callable, TypeVar

import torch

from specgen import registry
from specgen.native import cpu_signature
from specgen.paths import atomic_write_text

#: The least share of a core a measurement's thread may get and still be stored: quiet ~0.99, beside two busy
#: processes on two cores ~0.6 (a measurement kept from such a run slowed every later start ~40%).
QUIET_SHARE = 0.9
T = TypeVar("T")
WARNED: set[str] = set()  # homes whose caches could not be written, warned about once


@functools.cache
def machine() -> str:
    """What a stored measurement depends on besides its model: this CPU (model name, flags) and this torch."""
    return hashlib.sha256(f"{cpu_signature()}\ntorch {torch.__version__}".encode()).hexdigest()[:16]


def read(file: Path) -> dict:
    """The entries stored in `file` ({} when there are none, or the file does not parse)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def timed_quietly(measure: Callable[[], T]) -> tuple[T, bool]:
    """`measure()`, and whether its thread kept its core (thread CPU time >= QUIET_SHARE of wall time). Processes that
    take the core show as wall time this thread did not run; a measurement made while they did is used by this
    process and not kept for later starts. The calling thread takes part in every timed product (OpenMP's first
    thread), so it alone tells."""
    wall, cpu = time.perf_counter(), time.thread_time()
    result = measure()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return result, cpu >= QUIET_SHARE * wall - 1e-3  # a millisecond's slack: a call that short cannot tell


def add(file: Path, k: str, entry) -> None:
    """Store `entry` under `k` in `file` (read again first: other processes' entries stay); a folder that cannot be
    written warns once and the process keeps its own measurement."""
    entries = read(file)
    entries[k] = entry
    try:
        atomic_write_text(file, json.dumps(entries, indent=1, sort_keys=True))
    except OSError as e:
        warn_unwritable(file.parent, e.strerror or str(e))


def warn_unwritable(folder: Path, why: str) -> None:
    """Warn that a cache under this home cannot be written (cost curves, decoded weights): once per process and
    home, whichever cache meets it first; the process runs on with what it measured and built itself."""
    if str(registry.home()) not in WARNED:
        WARNED.add(str(registry.home()))
        warnings.warn(f"cost curves and decoded weights are not cached ({folder}: {why}); each start "
                      "measures and lays them out again", stacklevel=3)
