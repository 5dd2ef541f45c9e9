"""VVS skip schedules (Sec. 4.4, Algorithm 1): whether a draft step skips its verification (docs/methods/vvs.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from specgen.decoding.draft import Draft
from specgen.devices import to_device


class SkipSchedule:
    """Decides, per draft step, whether to skip verification (from the draft and the verified run alone); this base
    (schedule none) always verifies, so VVS's loop reduces to EAGLE-2 + the accept rule."""

    def decide(self, draft: Draft, verified_run: int) -> bool:
        """True = accept a path of `draft` without a target forward."""
        return False


def may_skip(draft: Draft, verified_run: int) -> bool:
    """The hard constraints: the previous step was verified (so never twice in a row, never the first
    step) and there is a non-empty draft to take a path from."""
    return verified_run >= 1 and draft.size > 0


@dataclass
class UniformSkip(SkipSchedule):
    """VVS-U: skip every `interval`-th step (after `interval - 1` verified ones)."""

    interval: int = 3

    def decide(self, draft: Draft, verified_run: int) -> bool:
        return may_skip(draft, verified_run) and verified_run >= self.interval - 1


def path_similarity(draft: Draft, unit_codes: torch.Tensor, alpha: float = 0.8, stride: int = 2) -> float:
    """Eq. 2: decay-weighted mean pairwise cosine similarity of the draft's paths (`unit_codes` [V, D]: normalised).

    The sum over ordered pairs i != j of <e_i, e_j> is |sum e|^2 - sum |e|^2: O(P * L * D) for P paths of length L."""
    paths = [[draft.tokens[i] for i in p] for p in draft.tree.paths()]
    if stride > 1 and len(paths[::stride]) >= 2:
        paths = paths[::stride]
    if len(paths) < 2:
        return 1.0
    toks = pad_sequence([torch.tensor(p) for p in paths], batch_first=True).to(unit_codes.device)  # [P, L]
    valid = pad_sequence([torch.ones(len(p), dtype=torch.bool) for p in paths], batch_first=True).to(toks.device)
    e = unit_codes[toks] * valid[..., None]  # [P, L, D]
    total = e.sum(0)  # [L, D]
    pairs_sum = (total * total).sum(-1) - (e * e).sum((0, 2))  # [L]: sum over ordered pairs i != j
    n = valid.sum(0).double()
    keep = n >= 2
    s_l = pairs_sum.double()[keep] / (n[keep] * (n[keep] - 1))
    w = to_device(torch.tensor([alpha**l for l in range(toks.shape[1])], dtype=torch.float64), s_l.device)[keep]
    return float((w * s_l).sum() / w.sum())


@dataclass
class DynamicSkip(SkipSchedule):
    """VVS-D (Algorithm 1): skip when `path_similarity` >= `threshold` (and the last step was verified)."""

    codebook: torch.Tensor  # [V, D] raw VQ codebook
    threshold: float = 0.75
    alpha: float = 0.8
    stride: int = 2

    def __post_init__(self) -> None:
        self.unit = torch.nn.functional.normalize(self.codebook.detach().float(), dim=-1)

    def decide(self, draft: Draft, verified_run: int) -> bool:
        if not may_skip(draft, verified_run):  # Algorithm 1, line 1: once skipped, verify the next step
            return False
        return path_similarity(draft, self.unit, self.alpha, self.stride) >= self.threshold
