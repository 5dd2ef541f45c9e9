"""Sampling utilities: parameters, logits -> probabilities (temperature, top-k, top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; temperature 0 means greedy (argmax). Its values come from configs, whose ranges
    `load_config` has checked (temperature >= 0, top_k >= 0, top_p in (0, 1])."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] (float32) after temperature, top-k and top-p filtering; greedy: the argmax's one-hot."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        top = logits.topk(params.top_k, dim=-1)  # values/indices [..., k], sorted descending
        kth = top.values[..., -1:]
        keep = logits >= kth  # [..., V]; ties with the k-th value are kept
        if bool((keep.sum(-1) == params.top_k).all()):  # no ties: filter the k sorted values only, in O(V)
            p = top.values.softmax(-1)  # [..., k], descending
            if params.top_p < 1.0:
                p = p.masked_fill(p.cumsum(-1) - p >= params.top_p, 0.0)
                p = p / p.sum(-1, keepdim=True)
            return torch.zeros_like(logits).scatter(-1, top.indices, p)
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each entry
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def on_generator(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`probs` on the generator's device: seeded streams are CPU generators, and a draw from CUDA probabilities with
    one would fail; the same stream then gives the same draws on every device (a no-op on cpu)."""
    if generator is None or generator.device == probs.device:
        return probs
    return probs.to(generator.device)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]."""
    return int(torch.multinomial(on_generator(probs, generator), 1, generator=generator))


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """One independent draw per row of probs [R, V] by inverse CDF (one cumsum + searchsorted, not R multinomials).

    Zero-probability ids are never drawn: the CDF does not rise at them; a uniform rounded up to the total falls back
    to the row's last positive id."""
    probs = on_generator(probs, generator)
    cdf = probs.float().cumsum(-1)  # [R, V]
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device) * cdf[:, -1:]  # [R, 1]
    idx = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)  # [R]
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).float().argmax(-1)  # [R] last positive id
    return torch.minimum(idx, last).tolist()


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Argmax when greedy, else a sample of the filtered distribution; logits [V]."""
    if params.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, params), generator)
