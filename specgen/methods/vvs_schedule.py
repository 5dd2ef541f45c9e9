"""VVS skip schedules (paper Sec. 4.4, Algorithm 1): when may a draft step skip its verification?

Every schedule answers `decide(draft, verified_run)`, where `verified_run` is the number of verified
steps in a row just before this one (0 at the first step and right after a skipped step). The hard
constraint of Sec. 4.1 ("never two verification-free steps in a row") is `verified_run >= 1`; every
schedule below respects it, and the VVS loop enforces it again (`may_skip`) for any other schedule.
The first draft step is never skipped either: only a verification step caches the target features
that the drafter needs to continue without one (the prefill gives the condition position's only).

- `UniformSkip(interval)` (VVS-U): after `interval - 1` verified steps the next one is skipped, so the
  pattern is V^(i-1) S V^(i-1) S ...; `interval >= 2`.
- `DynamicSkip(codebook, threshold, alpha, stride)` (VVS-D): skip when the decay-weighted similarity of
  the draft tree's candidate paths (`path_similarity`, Eq. 2) is at least `threshold`.
- `NeverSkip`: VVS's loop without skipping: exactly EAGLE-2 + the accept rule (a regression baseline).

Choices the paper leaves open (documented here, used by `path_similarity`):
- Candidate paths are the draft tree's root-to-leaf paths (node tokens), the same set from which a
  skipped step samples its path.
- `Downsample(C, stride=2)` keeps every `stride`-th path (C[::stride]), not every other position: the
  paper reports the down-sampled similarity at ~25% of the cost, which is what halving the paths of a
  pairwise (quadratic) comparison gives. It is skipped when it would leave fewer than 2 paths.
- S^(l) at depth l is the mean cosine similarity over all pairs of (kept) paths that reach depth l,
  computed on the L2-normalised VQ codebook vectors of their tokens; depths reached by fewer than two
  paths are left out and the weights alpha^l / sum(alpha^k) are renormalised over the depths kept. A
  tree with a single path has similarity 1 (nothing to disagree with).
- alpha defaults to 0.8 (the paper gives no value); threshold defaults to 0.75, the middle of the
  paper's VVS-D sweep (0.70, 0.75, 0.80).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specgen.decoding.draft import Draft


class SkipSchedule(Protocol):
    """Decides, per draft step, whether to skip verification."""

    def reset(self) -> None: ...

    def decide(self, draft: Draft, verified_run: int) -> bool:
        """True = accept a path of `draft` without a target forward."""
        ...


def may_skip(draft: Draft, verified_run: int) -> bool:
    """The hard constraints: the previous step was verified (so never twice in a row, never the first
    step) and there is a non-empty draft to take a path from."""
    return verified_run >= 1 and draft.size > 0


@dataclass
class NeverSkip:
    """Always verify (VVS's loop reduces to EAGLE-2 + the accept rule)."""

    def reset(self) -> None:
        pass

    def decide(self, draft: Draft, verified_run: int) -> bool:
        return False


@dataclass
class UniformSkip:
    """VVS-U: skip every `interval`-th step (after `interval - 1` verified ones)."""

    interval: int = 3

    def __post_init__(self) -> None:
        if self.interval < 2:
            raise ValueError(f"skip interval must be >= 2, got {self.interval}")

    def reset(self) -> None:
        pass

    def decide(self, draft: Draft, verified_run: int) -> bool:
        return may_skip(draft, verified_run) and verified_run >= self.interval - 1


def path_similarity(draft: Draft, unit_codes: torch.Tensor, alpha: float = 0.8, stride: int = 2) -> float:
    """Eq. 2: decay-weighted mean pairwise cosine similarity of the draft's root-to-leaf paths.

    `unit_codes` [V, D] are the L2-normalised codebook vectors. Cost O(P * L * D) for P paths of
    length <= L: the sum over ordered pairs i != j of <e_i, e_j> is |sum e|^2 - sum |e|^2.
    """
    paths = [[draft.tokens[i] for i in p] for p in draft.tree.paths()]
    if stride > 1 and len(paths[::stride]) >= 2:
        paths = paths[::stride]
    if len(paths) < 2:
        return 1.0
    length = max(len(p) for p in paths)
    toks = torch.zeros(len(paths), length, dtype=torch.long)
    valid = torch.zeros(len(paths), length, dtype=torch.bool)
    for i, p in enumerate(paths):
        toks[i, : len(p)] = torch.tensor(p)
        valid[i, : len(p)] = True
    toks, valid = toks.to(unit_codes.device), valid.to(unit_codes.device)
    e = unit_codes[toks] * valid[..., None]  # [P, L, D]
    total = e.sum(0)  # [L, D]
    pairs_sum = (total * total).sum(-1) - (e * e).sum((0, 2))  # [L]: sum over ordered pairs i != j
    n = valid.sum(0).double()
    keep = n >= 2
    s_l = pairs_sum.double()[keep] / (n[keep] * (n[keep] - 1))
    w = torch.tensor([alpha**l for l in range(length)], dtype=torch.float64, device=s_l.device)[keep]
    return float((w * s_l).sum() / w.sum())


@dataclass
class DynamicSkip:
    """VVS-D (Algorithm 1): skip when `path_similarity` >= `threshold` (and the last step was verified)."""

    codebook: torch.Tensor  # [V, D] raw VQ codebook
    threshold: float = 0.75
    alpha: float = 0.8
    stride: int = 2
    similarities: list[float] = field(default_factory=list)  # every similarity computed (diagnostics)

    def __post_init__(self) -> None:
        self.unit = torch.nn.functional.normalize(self.codebook.detach().float(), dim=-1)

    def reset(self) -> None:
        self.similarities = []

    def decide(self, draft: Draft, verified_run: int) -> bool:
        if not may_skip(draft, verified_run):  # Algorithm 1, line 1: once skipped, verify the next step
            return False
        s = path_similarity(draft, self.unit, self.alpha, self.stride)
        self.similarities.append(s)
        return s >= self.threshold
