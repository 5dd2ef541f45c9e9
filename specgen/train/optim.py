"""The optimiser side of every training recipe: AdamW keys and linear warmup + cosine decay."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW recipe keys as flat fields of a recipe dataclass (which may redeclare a default)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global gradient norm (0 = no clipping)

    def adamw(self, params: Iterable[torch.nn.Parameter], lr: float | None = None) -> torch.optim.AdamW:
        """AdamW over `params` at `lr` (default: the recipe's)."""
        return torch.optim.AdamW(params, lr=self.lr if lr is None else lr, betas=(self.beta1, self.beta2),
                                 weight_decay=self.weight_decay)


@dataclass(frozen=True)
class OptimConfig(AdamWConfig):
    """AdamW keys plus a linear warmup + cosine decay schedule."""

    min_lr: float = 5e-5
    warmup_steps: int = 50

    def lr_at(self, step: int, total: int) -> float:
        """The learning rate of (0-based) `step` of a `total`-step run."""
        return cosine_lr(step, total, self.lr, self.min_lr, self.warmup_steps)


def cosine_lr(step: int, total: int, lr: float, min_lr: float, warmup: int = 0) -> float:
    """Linear warmup to `lr` over `warmup` steps, then cosine decay to `min_lr` at step `total` (flat after)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))

