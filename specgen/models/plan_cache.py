"""Kernel plans on disk (`$SPECGEN_HOME/plans/`) per machine, torch, threads and shapes; `decoding/cost.py`'s too."""

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

FILE = "kernel-plans.json"
#: The least share of a core a measurement's thread may get and still be stored: quiet ~0.99, beside two busy
#: processes on two cores ~0.6 (a plan timed so picked other kernels and slowed every later start by ~40%).
QUIET_SHARE = 0.9
T = TypeVar("T")
WARNED: set[str] = set()  # homes whose caches could not be written, warned about once


@functools.cache
def machine() -> str:
    """What a plan depends on besides the shapes: this CPU (model name, flags) and this torch."""
    return hashlib.sha256(f"{cpu_signature()}\ntorch {torch.__version__}".encode()).hexdigest()[:16]


def path() -> Path:
    return registry.home() / "plans" / FILE


def key(signature: tuple, threads: int) -> str:
    """machine | threads | a digest of the weight shapes and dtypes (a decoder lists hundreds)."""
    shapes = ";".join(f"{i}x{o}:{str(d).removeprefix('torch.')}" for i, o, d in signature)
    return f"{machine()}|{threads}|{hashlib.sha256(shapes.encode()).hexdigest()[:16]}"


def read(file: Path | None = None) -> dict:
    """The entries stored in `file` (default: the plans; {} when there are none, or the file does not parse)."""
    try:
        data = json.loads((file or path()).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(k: str, busy: bool = False) -> tuple[int, tuple[int, int | None] | None] | None:
    """(min_rows, native) stored under `k` from a quiet timing (`busy`: from any), or None (nothing stored, or an
    entry that does not parse)."""
    got = read().get(k)
    try:
        if got.get("busy") and not busy:
            return None
        min_rows, native = int(got["min_rows"]), got["native"]
        return min_rows, None if native is None else (int(native[0]), None if native[1] is None else int(native[1]))
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        return None


def timed_quietly(measure: Callable[[], T]) -> tuple[T, bool]:
    """`measure()`, and whether its thread kept its core (thread CPU time >= QUIET_SHARE of wall time). Processes that
    take the core show as wall time this thread did not run; a measurement made while they did is used by this
    process and not kept for later starts (a kernel plan is kept for busy starts only:
    `kernel_choice.stored_or_measured`). The calling thread takes part in every timed product (OpenMP's first
    thread), so it alone tells."""
    wall, cpu = time.perf_counter(), time.thread_time()
    result = measure()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return result, cpu >= QUIET_SHARE * wall - 1e-3  # a millisecond's slack: a call that short cannot tell


def quiet_now(seconds: float = 0.05) -> bool:
    """Whether this thread keeps its core now: a spin of `seconds`, judged as `timed_quietly` judges a timing."""
    end = time.perf_counter() + seconds

    def spin() -> None:
        while time.perf_counter() < end:
            pass

    return timed_quietly(spin)[1]


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
    """Warn that a cache under this home cannot be written (plans, cost curves, decoded weights): once per process and
    home, whichever cache meets it first; the process runs on with what it measured and built itself."""
    if str(registry.home()) not in WARNED:
        WARNED.add(str(registry.home()))
        warnings.warn(f"kernel plans, cost curves and decoded weights are not cached ({folder}: {why}); each start "
                      "measures and lays them out again", stacklevel=3)
