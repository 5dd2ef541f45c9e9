"""Verify inputs for a batch: each row's root + draft tree, padded into one forward with per-row masks and positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.cache import KVCache
from specgen.decoding.draft import Draft
from specgen.decoding.target import Target, TargetOut
from specgen.devices import host_tensor, to_device


@dataclass(frozen=True)
class VerifyBatch:
    """One verify forward's inputs; `sizes[i]` = S_i real nodes of row i (the rest is padding)."""

    tokens: torch.Tensor  # [B, S]
    positions: torch.Tensor  # [B, S]
    tree_mask: torch.Tensor | None  # [B, S, S] ancestor masks (padding: itself only); None = causal chains
    sizes: tuple[int, ...]  # [B]


def verify_batch(roots: list[int], drafts: list[Draft], starts: list[int], device) -> VerifyBatch:
    """Pad every row's root + draft to S = the largest; starts[i] = the position of row i's root."""
    sizes = tuple(d.size + 1 for d in drafts)
    s = max(sizes)
    if all(d.tree.is_chain for d in drafts) and len(set(sizes)) == 1:  # equal chains: the causal mask says it all
        tokens = host_tensor([(r,) + d.tokens for r, d in zip(roots, drafts)], device)
        positions = to_device(torch.tensor(starts)[:, None] + torch.arange(s), device)
        return VerifyBatch(tokens, positions, None, sizes)
    tokens = host_tensor([(r,) + d.tokens + (r,) * (s - n) for r, d, n in zip(roots, drafts, sizes)], device)
    offsets = torch.zeros(len(drafts), s, dtype=torch.long)
    mask = torch.eye(s, dtype=torch.bool).repeat(len(drafts), 1, 1)  # [B, S, S]: padding sees itself
    for i, (d, n) in enumerate(zip(drafts, sizes)):
        offsets[i, :n] = d.tree.offsets()
        mask[i, :n, :n] = d.tree.mask()
    positions = torch.tensor(starts)[:, None] + offsets
    return VerifyBatch(tokens, to_device(positions, device), to_device(mask, device), sizes)


def forward_span(target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]
                 ) -> tuple[KVCache, TargetOut, tuple[int, ...]]:
    """One forward over the sequences [lo, hi) spanning `feeds` (sequence -> root, draft; one between them feeds a
    padding node): the view of their cache rows (commit through it, then `absorb` at lo), the output, `sizes`."""
    lo, hi, br = min(feeds), max(feeds) + 1, target.branches
    view = cache.rows(lo * br, hi * br)
    fed = [feeds.get(i, (0, Draft.empty())) for i in range(lo, hi)]
    batch = verify_batch([r for r, _ in fed], [d for _, d in fed], view.lengths[::br], target.device)
    return view, target.forward(batch.tokens, batch.positions, view, batch.tree_mask), batch.sizes
