"""Pure lossless accept rules: (draft, target distributions) -> Verdict; row 0 is the root, row i + 1 draft node i."""

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
