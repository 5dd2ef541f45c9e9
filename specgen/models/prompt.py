"""Prompt mode: a prefill may use faster kernels than decode steps (it runs once per sequence, alike in all methods)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

_ACTIVE: ContextVar[bool] = ContextVar("specgen_prompt_mode", default=False)


@contextmanager
def prompt_mode() -> Iterator[None]:
    """Run the block as a prompt prefill."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether the current forward is a prompt prefill."""
    return _ACTIVE.get()
