"""DraftTree: depths, children, what each verify input sees, and root-to-leaf paths of a draft."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property


@dataclass(frozen=True)
class DraftTree:
    """Topology of a draft, independent of its tokens."""

    parents: tuple[int, ...]  # [N] in topological order; -1 = the root (the last committed token, verify input 0)

    def __post_init__(self) -> None:
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must precede their children")

    @staticmethod
    @cache
    def chain(n: int) -> "DraftTree":
        """The chain of n nodes: one tree per length, shared (it is immutable), so its cached properties are computed
        once, not at every decode step of every row."""
        return DraftTree(tuple(range(-1, n - 1)))

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        """Depth of each node; children of the root have depth 1."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return tuple(d)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[0] are the root's children; children[i + 1] those of node i."""
        kids: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.size - 1))

    def max_depth(self) -> int:
        return max(self.depth, default=0)

    @cached_property
    def mask(self) -> bytes:
        """The verify's tree mask [N + 1, N + 1] as a bool tensor's bytes: input q sees input k (the root, its
        ancestors, itself). A row is its parent's with its own entry set: one copy a node."""
        n = self.size + 1
        rows = [bytearray(n)]
        rows[0][0] = 1
        for i, p in enumerate(self.parents):
            rows.append(bytearray(rows[p + 1]))
            rows[-1][i + 1] = 1
        return b"".join(rows)

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path (node ids), one a leaf in node order: the leaf's ancestors, then itself."""
        out = []
        for leaf in (i for i in range(self.size) if not self.children[i + 1]):
            path = [leaf]
            while self.parents[path[-1]] >= 0:
                path.append(self.parents[path[-1]])
            out.append(path[::-1])
        return out
