"""Pure accept rules: (draft, target distributions) -> Verdict. No model, no cache.

Verify outputs are indexed like the verify inputs: row 0 is the root (last committed token),
row i + 1 is draft node i; row r holds the target's distribution of the token that follows input r.

- `accept_greedy`: follow the child whose token is the target's argmax (lossless at temperature 0).
- `accept_rejection`: lossless speculative sampling over a tree (Leviathan et al. / Chen et al. for a
  chain; SpecInfer's multi-candidate form for siblings). A node drawn from q is accepted with
  probability min(1, p(x)/q(x)); on rejection the target distribution becomes norm(max(p - q, 0))
  and the next sibling is tried. Deterministic drafts (EAGLE's top-k trees, n-gram, Jacobi) have no
  q: q is the one-hot of the drafted token, so acceptance is p(x) and a rejection zeroes p(x).
"""

from __future__ import annotations

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import sample


def accept_greedy(draft: Draft, argmax: list[int]) -> Verdict:
    """Longest path whose every token equals the target's argmax at its parent; argmax [N + 1]."""
    kids, node, path = draft.tree.children, -1, []
    while True:
        want = argmax[node + 1]
        nxt = next((c for c in kids[node + 1] if draft.tokens[c] == want), None)
        if nxt is None:
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (want,))
        path.append(nxt)
        node = nxt


def accept_rejection(draft: Draft, probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Lossless tree rejection sampling; probs [N + 1, V] are the target's filtered distributions."""
    kids, node, path = draft.tree.children, -1, []
    while True:
        p = probs[node + 1]
        moved = False
        for c in kids[node + 1]:
            tok = draft.tokens[c]
            q_tok = 1.0 if draft.probs is None else float(draft.probs[c, tok])
            u = float(torch.rand((), generator=generator))
            if q_tok > 0 and u * q_tok < float(p[tok]):  # u < p/q, written without division
                path.append(c)
                node, moved = c, True
                break
            p = residual(p, draft.probs[c] if draft.probs is not None else None, tok)
        if not moved:
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (sample(p, generator),))


def residual(p: torch.Tensor, q: torch.Tensor | None, tok: int) -> torch.Tensor:
    """norm(max(p - q, 0)); q None means the one-hot of `tok`. Falls back to p if nothing is left."""
    if q is None:
        r = p.clone()
        r[tok] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p
