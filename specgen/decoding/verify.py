"""Verify inputs for a batch: each row's root + draft tree, padded into one forward with per-row masks and positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.target import Target, TargetOut
from specgen.devices import host_inputs
from specgen.models.cache import KVCache


@dataclass(frozen=True)
class VerifyBatch:
    """One verify forward's inputs; `sizes[i]` = S_i real nodes of row i (the rest is padding)."""

    tokens: torch.Tensor  # [B, S]
    positions: torch.Tensor  # [B, S]
    tree_mask: torch.Tensor | None  # [B, S, S] ancestor masks (padding: itself only); None = causal chains
    sizes: tuple[int, ...]  # [B]


@dataclass(frozen=True)
class HostBatch:
    """`VerifyBatch`'s inputs as built on the host: tokens, positions [B][S], the tree mask [B, S, S] as a bool
    tensor's bytes (None: equal chains, causal) and the sizes."""

    tokens: list[list[int]]
    positions: list[list[int]]
    mask: bytearray | None
    sizes: tuple[int, ...]

    def tree_mask(self) -> torch.Tensor | None:
        """The tree mask [B, S, S] on the host (None: causal chains): one host op, the view over its bytes."""
        if self.mask is None:
            return None
        b, s = len(self.tokens), len(self.tokens[0])
        return torch.frombuffer(self.mask, dtype=torch.bool).view(b, s, s)  # the batch's bytes (one forward's): no copy

    def to(self, device) -> VerifyBatch:
        """On `device`: tokens and positions in one copy, the mask in another."""
        return VerifyBatch(*host_inputs(self.tokens, self.positions, self.tree_mask(), device), self.sizes)


def host_batch(roots: list[int], drafts: list[Draft], starts: list[int]) -> HostBatch:
    """Pad every row's root + draft to S = the largest; starts[i] = the position of row i's root. Built on the host
    (the drafts are there): a GPU step launches no kernel for it (`tree_inputs` builds the same from trees that are on
    the device)."""
    sizes = tuple(d.size + 1 for d in drafts)
    s = max(sizes)
    if all(d.tree.is_chain for d in drafts) and len(set(sizes)) == 1:  # equal chains: the causal mask says it all
        return HostBatch([[r, *d.tokens] for r, d in zip(roots, drafts)], [list(range(p, p + s)) for p in starts],
                         None, sizes)
    mask = bytearray()  # row by row: each tree's mask (a node sees the root, its ancestors, itself), its rows padded
    for d, n in zip(drafts, sizes):  # to S; a padding node sees only itself
        own = d.tree.mask
        mask += own if n == s else b"".join(own[q * n : (q + 1) * n] + bytes(s - n) for q in range(n))
        for j in range(n, s):
            mask += bytes(j) + b"\x01" + bytes(s - j - 1)
    return HostBatch([[r, *d.tokens] + [r] * (s - n) for r, d, n in zip(roots, drafts, sizes)],
                     [[p, *(p + o for o in d.tree.depth)] + [p] * (s - n)  # padding: the root's position
                      for p, d, n in zip(starts, drafts, sizes)], mask, sizes)


def tree_inputs(tokens: torch.Tensor, parents: torch.Tensor, counts: torch.Tensor, roots: torch.Tensor,
                root_pos: torch.Tensor, levels: int) -> tuple[torch.Tensor, ...]:
    """The verify's inputs for n trees of up to t nodes on the device: tokens, positions [n, S] and tree mask
    [n, S, S], S = t + 1. `tokens`, `parents` [n, t]: each row's first counts[i] nodes in topological order, a parent
    as its node's index (-1: the root); `levels`: the deepest tree's depth. Input 0 is the root (its token and
    position given), a node sees the root, its ancestors and itself at the root's position plus its depth; a padding
    node is the root's token at the root's position, seeing itself."""
    n, t = tokens.shape
    idx = torch.arange(t + 1, device=tokens.device)  # [S]
    kept = idx[1:] <= counts[:, None]  # [n, t]
    up = torch.cat([idx[:1].expand(n, 1), torch.where(kept, parents + 1, idx[1:])], 1)  # [n, S]: input of the parent
    seen = (idx[:, None] == idx).expand(n, -1, -1)  # [n, S, S]: each input sees itself
    rounds = levels.bit_length()
    for r in range(rounds):  # pointer jumping: after round r, every ancestor up to 2^(r+1) - 1 levels up
        seen = seen | seen.gather(1, up[:, :, None].expand(-1, -1, t + 1))
        if r + 1 < rounds:
            up = up.gather(1, up)  # the ancestor 2^(r+1) levels up (the root and padding stay put)
    inputs = torch.cat([roots[:, None], torch.where(kept, tokens, roots[:, None])], 1)  # [n, S]
    return inputs, root_pos[:, None] + seen.sum(-1) - 1, seen


@dataclass(frozen=True)
class Span:
    """A step's target work over the sequences [lo, hi) it spans: the view of their cache rows (commit through it, then
    `absorb` at lo), the output (row i: its first sizes[i] nodes are real) and the target forwards it ran."""

    view: KVCache
    out: TargetOut
    sizes: tuple[int, ...]
    forwards: int = 1


def forward_span(target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
    """One forward over the sequences [lo, hi) spanning `feeds` (sequence -> root, draft; one between them feeds a
    padding node). Its inputs stay on the host, as lists: a captured step stages them in one copy with its own, an
    eager forward moves them (`Transformer.eager`)."""
    lo, hi, br = min(feeds), max(feeds) + 1, target.branches
    view = cache.rows(lo * br, hi * br)
    fed = [feeds.get(i, (0, Draft.empty())) for i in range(lo, hi)]
    batch = host_batch([r for r, _ in fed], [d for _, d in fed], view.lengths[::br])
    return Span(view, target.forward(batch.tokens, batch.positions, view, batch.tree_mask()), batch.sizes)
