"""Modules built without torch.nn.init's random fills: their weights are loaded next, or only their shapes read."""

from __future__ import annotations

import contextlib

import torch

RANDOM_FILLS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                "xavier_normal_", "orthogonal_")


@contextlib.contextmanager
def random_fills_skipped():
    """Module construction without torch.nn.init's random fills: `checkpoints.load_state` overwrites (and requires)
    every parameter; computed buffers (RoPE tables) are built as usual. On the meta device a fill would import
    torch._dynamo (seconds), where a build for its shapes needs none."""
    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_FILLS}
    vars(torch.nn.init).update(dict.fromkeys(RANDOM_FILLS, lambda tensor, *args, **kwargs: tensor))
    try:
        yield
    finally:
        vars(torch.nn.init).update(saved)
