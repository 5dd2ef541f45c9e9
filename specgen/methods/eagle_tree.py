"""EAGLE draft-tree pieces shared by the one-row drafter (methods/eagle.py) and the batched one (eagle_batch.py):
a tree's shape, and the selection of its best nodes."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.decoding.draft import Draft
from specgen.decoding.tree import DraftTree


@dataclass(frozen=True)
class TreeShape:
    """Depth (levels), width (top-k per expansion and beam size) and node budget of one draft tree."""

    depth: int
    top_k: int
    total_tokens: int


def select_nodes(tokens: list[int], parents: list[int], scores: list[float], total: int) -> Draft:
    """Keep the `total` best-scored nodes and their ancestors, in recording (topological) order."""
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:total]
    keep = set(order)
    for i in order:
        p = parents[i]
        while p >= 0 and p not in keep:
            keep.add(p)
            p = parents[p]
    kept = sorted(keep)
    new_id = {old: new for new, old in enumerate(kept)}
    return Draft(tuple(tokens[i] for i in kept), DraftTree(tuple(new_id.get(parents[i], -1) for i in kept)))
