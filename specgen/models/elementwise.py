"""Elementwise CPU ops (activations, exp, tanh) whose bits per element do not depend on the tensor's size or threads."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from specgen.models import prompt

# torch's CPU elementwise loop runs whole pairs of vector registers and takes a call's last partial pair through a
# scalar path, whose float32 transcendental functions (exp, tanh: silu, sigmoid, gelu) round otherwise. Threaded, each
# thread's share ends so too, and shares split at an op's own grain (silu's 32768 elements, gelu's n / threads), not
# at rows. So an element's bits moved with the row count: at 3 or more threads over a [T, 4864] or [T, 11008]
# activation, at any over a [T, 1] gate (tests/models/test_elementwise.py), and a verify's row then differed from the
# AR step's. Lossless methods need a row's bits independent of the rows beside it: `row_invariant` runs an op on one
# thread over whole vectors, where every element takes the vector path.

LANES = 64  # a multiple of every CPU vector loop's step (two registers a step: AVX-512's 32 floats, 64 bfloat16s)


def row_invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise `fn`, each element's bits independent of x's size, layout and torch's threads: on a CPU
    over x flattened and padded to whole LANES, on one thread (torch's thread count is restored after: ~0.3 us). A
    prompt's prefill (scored once, alike under every method: models/prompt.py) and CUDA (its kernels compute every
    element alike) take fn(x) as it is."""
    if x.device.type != "cpu" or prompt.active():
        return fn(x)
    n, threads = x.numel(), torch.get_num_threads()
    flat = x.reshape(-1)  # [n]
    if n % LANES:
        flat = F.pad(flat, (0, -n % LANES))
    if threads > 1:
        torch.set_num_threads(1)
    try:
        y = fn(flat)
    finally:
        if threads > 1:
            torch.set_num_threads(threads)
    return y[:n].view(x.shape)
