"""LANTERN relaxed acceptance (LOSSY): pool a draft token's latent neighbours' mass, bounded by TVD delta."""

from __future__ import annotations

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import SamplingParams, logits_to_probs, sample


def pooled(p: torch.Tensor, nbrs: torch.Tensor, delta: float) -> tuple[float, int]:
    """(c_j, j): the largest neighbour prefix whose mass stays <= delta; p [V], nbrs [k]."""
    c = p[nbrs].cumsum(0)
    j = int((c <= delta).sum())  # cumsum is non-decreasing, so this is the largest valid prefix
    return (float(c[j - 1]) if j else 0.0), j


def accept_lantern(draft: Draft, logits: torch.Tensor, params: SamplingParams, generator,
                   neighbours: torch.Tensor, delta: float) -> Verdict:
    """Relaxed tree acceptance; logits [N + 1, V] (CFG-combined), neighbours [V, k]."""
    greedy = params.greedy
    probs = logits.float().softmax(-1) if greedy else logits_to_probs(logits, params)
    kids, node, path = draft.tree.children, -1, []
    while True:
        p = probs[node + 1].clone()
        moved = False
        for c in kids[node + 1]:
            x = draft.tokens[c]
            mass, j = pooled(p, neighbours[x], delta)
            if greedy:
                others = p.clone()
                others[x] = -1.0
                ok = float(p[x]) + mass >= float(others.max())
            else:
                ok = float(torch.rand((), generator=generator)) < float(p[x]) + mass
            if ok:
                path.append(c)
                node, moved = c, True
                break
            if not greedy:  # residual of p' after rejecting x
                p[x] = 0.0
                p[neighbours[x][:j]] = 0.0
                total = p.sum()
                p = p / total if total > 0 else probs[node + 1]
        if not moved:
            nxt = int(p.argmax()) if greedy else sample(p, generator)
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (nxt,))
