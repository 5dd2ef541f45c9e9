"""Sampling utilities: validated parameters, logits -> probabilities (temperature, top-k, top-p), CFG."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] after temperature, top-k and top-p filtering (float32).

    Greedy parameters give the one-hot of the argmax, so every accept rule sees one distribution.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each entry
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Argmax when greedy, else a sample of the filtered distribution; logits [V]."""
    if params.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, params), generator)


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance at the logits level: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)
