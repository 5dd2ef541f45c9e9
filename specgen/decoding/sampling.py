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


def logits_to_probs(logits: torch.Tensor, params: SamplingParams, host_reads: bool = True) -> torch.Tensor:
    """Probabilities [..., V] (float32) after temperature, top-k and top-p filtering; greedy: the argmax's one-hot.
    Each row on its own: a row's probabilities never depend on the rows beside it (a batch's, a tree's padding).
    `host_reads=False`: no value read on the host (a captured step's), at the price of top-k's tie path on every row."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        return top_k_probs(logits, params, host_reads)
    return top_p_probs(logits.softmax(-1), params.top_p)


def top_k_probs(logits: torch.Tensor, params: SamplingParams, host_reads: bool = True) -> torch.Tensor:
    """Top-k, then top-p, probabilities [..., V] of tempered logits [..., V]. A row without ties at its k-th value
    from its k sorted values alone, in O(V); a row with ties there (bfloat16 logits tie often) over every token tied
    with the k-th: chosen per row, so a neighbour's ties never change a row's numbers. The host reads whether any row
    ties, so that none pays the tie path when none ties; without `host_reads` every row pays it."""
    top = logits.topk(params.top_k, dim=-1)  # values/indices [..., k], sorted descending
    keep = logits >= top.values[..., -1:]  # [..., V]; ties with the k-th value are kept
    p = top.values.softmax(-1)  # [..., k], descending
    if params.top_p < 1.0:
        p = cut_sorted(p, params.top_p)
        p = p / p.sum(-1, keepdim=True)
    probs = torch.zeros_like(logits).scatter(-1, top.indices, p)
    tied = keep.sum(-1) > params.top_k  # [...]: rows whose k-th value is tied
    if not host_reads:
        ties = top_p_probs(logits.masked_fill(~keep, float("-inf")).softmax(-1), params.top_p)
        return torch.where(tied[..., None], ties, probs)
    if bool(tied.any()):
        probs[tied] = top_p_probs(logits[tied].masked_fill(~keep[tied], float("-inf")).softmax(-1), params.top_p)
    return probs


def top_p_probs(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [..., V] cut to the smallest most-likely set of mass >= top_p, renormalised (1: as given)."""
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(-1, descending=True)
    probs = torch.zeros_like(probs).scatter(-1, idx, cut_sorted(sorted_p, top_p))
    return probs / probs.sum(-1, keepdim=True)


def cut_sorted(sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Descending probabilities [..., n] with each entry after mass >= top_p zeroed (not renormalised)."""
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each entry
    return sorted_p.masked_fill(before >= top_p, 0.0)


class LazyRows:
    """Filtered, tempered distributions of logits rows [S, V], computed only when a rule reads them (a walk stops at
    the first rejection, so later rows never pay the top-k / top-p filter)."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams,
                 rows: dict[int, torch.Tensor] | None = None) -> None:
        self.logits, self.params, self.rows = logits, params, {} if rows is None else rows  # rows: made already

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = logits_to_probs(self.logits[i], self.params)  # [V]
        return self.rows[i]


def on_generator(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`probs` on the generator's device: seeded streams are CPU generators, and a draw from CUDA probabilities with
    one would fail; the same stream then gives the same draws on every device (a no-op on cpu)."""
    if generator is None or generator.device == probs.device:
        return probs
    return probs.to(generator.device)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]: one uniform of the generator, by inverse CDF (as `accept_sampled` draws its
    last token, so a rule's empty draft and AR draw alike)."""
    return sample_rows(probs[None], generator)[0]


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """One independent draw per row of probs [R, V] by inverse CDF (one cumsum + searchsorted, not R multinomials)."""
    probs = on_generator(probs, generator)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device)  # [R, 1]
    return inverse_cdf(probs, u).tolist()


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The ids [R] that uniforms u [R, 1] in [0, 1) pick from unnormalised probs [R, V], on their device, no host read.

    Zero-probability ids are never drawn: the CDF does not rise at them; a uniform rounded up to the total falls back
    to the row's last positive id."""
    cdf = probs.float().cumsum(-1)  # [R, V]
    total = cdf[:, -1:].contiguous()  # [R, 1]
    idx = torch.searchsorted(cdf, u * total, right=True)  # [R, 1]: the first id whose CDF passes u * total
    last = torch.searchsorted(cdf, total)  # [R, 1]: the first id where the CDF reaches its total (a positive one)
    return torch.minimum(idx, last)[:, 0]


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Argmax when greedy, else a sample of the filtered distribution; logits [V]."""
    if params.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, params), generator)
