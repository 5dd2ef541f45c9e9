"""Prompt mode: a prompt's prefill may run faster kernels than decode steps, because no later forward recomputes it.

Lossless speculation needs every verify forward to compute, for a token, exactly what an AR step computes for it
(quantized products row by row, width-invariant attention: models/quantize.py, models/attention.py). A prompt's
prefill is outside that contract: it runs once per sequence, the same way under AR and under every method
(`decoding/loop.py` admits every row through `Target.prefill`), and no step ever scores a prompt position again. So
its products and attention may round differently from a decode step's without any method's output departing from AR
of the same target: the state after the prefill (the prompt's KV cache and its last logits) is the same for all.

Inside `prompt_mode()`, a quantized product of at least `quantize.PROMPT_MIN_ROWS` rows dequantizes its weight to
bfloat16 for one GEMM, and a low-precision forward attends with SDPA in float32 instead of the chunked invariant
attention (docs/precision.md, "Prompt prefill").
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
