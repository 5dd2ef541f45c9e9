"""LOSSY accept rules of XSpecMesh (sec. 4.2): probability threshold and top-K_a, then one token recovered."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import sample


@dataclass(frozen=True)
class AcceptCriterion:
    """Which lossy rule and its parameter: delta for "threshold", K_a for "topk" (checked by XSpecMeshOptions)."""

    kind: str = "threshold"
    delta: float = 0.5
    top_k: int = 1


def accepted_length(tokens: tuple[int, ...], probs: torch.Tensor, crit: AcceptCriterion) -> int:
    """Length of the longest prefix of a chain draft whose every token passes the rule under its row of probs
    [N + 1, V] (or any row-indexable)."""
    for n, tok in enumerate(tokens):
        p = float(probs[n][tok])
        if not (p > crit.delta if crit.kind == "threshold" else p > 0.0 and int((probs[n] > p).sum()) < crit.top_k):
            return n
    return len(tokens)


def accept_lossy(draft: Draft, probs: torch.Tensor, crit: AcceptCriterion,
                 generator: torch.Generator | None, greedy: bool = False) -> Verdict:
    """Verdict for a chain draft under probs [N + 1, V]: the passing prefix + one token recovered (greedy: argmax)."""
    n = accepted_length(draft.tokens, probs, crit)
    row = probs[n]
    recovered = int(row.argmax()) if greedy else sample(row, generator)
    return Verdict(tuple(range(n)), draft.tokens[:n] + (recovered,))
