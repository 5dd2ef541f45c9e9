"""Prompt mode: a prompt's prefill may run faster kernels than decode steps, because no later forward recomputes it.

Invariant: a prefill runs once per sequence, the same way under AR and every method (docs/precision.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

_ACTIVE: ContextVar[bool] = ContextVar("specgen_prompt_mode", default=False)


@contextmanager
def prompt_mode() -> Iterator[None]:
    """Run the block as a prompt prefill (see the module docstring)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether the current forward is a prompt prefill."""
    return _ACTIVE.get()
