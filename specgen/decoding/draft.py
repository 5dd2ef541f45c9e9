"""Frozen dataclasses passed between the decode steps: Draft (proposal) and Verdict (acceptance); prefix trees."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.decoding.tree import DraftTree


@dataclass(frozen=True)
class Draft:
    """A proposal: tokens on a tree (a chain is a tree). A lossless rule takes each token as given (q = its one-hot):
    exact for any token fixed before the verify, a draw of the drafter's included."""

    tokens: tuple[int, ...]  # [N]
    tree: DraftTree

    @staticmethod
    def empty() -> "Draft":
        """No proposal (an AR step): one shared instance."""
        return EMPTY

    @classmethod
    def chain(cls, tokens: list[int] | tuple[int, ...]) -> "Draft":
        return cls(tuple(tokens), DraftTree.chain(len(tokens)))

    def __post_init__(self) -> None:
        if len(self.tokens) != self.tree.size:
            raise ValueError(f"draft has {len(self.tokens)} tokens but its tree has {self.tree.size} nodes")

    @property
    def size(self) -> int:
        return len(self.tokens)


EMPTY = Draft((), DraftTree.chain(0))


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one draft: the accepted path and the tokens to commit (vLLM's words: the accepted draft
    tokens, then one *recovered* token sampled from the residual after a rejection, or a *bonus* token)."""

    path: tuple[int, ...]  # accepted node ids, root-to-leaf order
    tokens: tuple[int, ...]  # accepted draft tokens + one recovered/bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    def kept(self, chain: int = 0) -> list[int]:
        """The fed nodes to commit when the draft hung from `chain` fed nodes after the root: root, chain, path."""
        return list(range(chain + 1)) + [chain + 1 + j for j in self.path]


def prefix_tree(branches: list[list[int]], first: int = 0, most: int | None = None) -> tuple[Draft, list[list[int]]]:
    """The branches merged into one prefix tree (shared prefixes verified once), branch `first`'s nodes first, then the
    others' in order, at most `most` nodes (a branch ends at the first node past them); nodes[b][k] = the verify input
    of branch b's first k tokens (0 = the root), so a greedy walk of the tree finds the longest accepted branch."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    nodes: list[list[int]] = [[] for _ in branches]
    for b in [first, *(i for i in range(len(branches)) if i != first)]:
        at, node = [0], -1
        for t in branches[b]:
            key = (node, t)
            if key not in child:
                if most is not None and len(tokens) >= most:
                    break
                child[key] = len(tokens)
                tokens.append(t)
                parents.append(node)
            node = child[key]
            at.append(node + 1)
        nodes[b] = at
    return Draft(tuple(tokens), DraftTree(tuple(parents))), nodes
