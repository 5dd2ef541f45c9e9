"""Frozen dataclasses passed between the decode steps: Draft (proposal) and Verdict (acceptance)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.tree import DraftTree


@dataclass(frozen=True)
class Draft:
    """A proposal: tokens on a tree (a chain is a tree); probs are the distributions they were drawn from."""

    tokens: tuple[int, ...]  # [N]
    tree: DraftTree
    probs: torch.Tensor | None = None  # [N, V]: q of node i's sampling distribution; None = deterministic

    @staticmethod
    def empty() -> "Draft":
        """No proposal (an AR step): one shared instance."""
        return EMPTY

    @classmethod
    def chain(cls, tokens: list[int] | tuple[int, ...], probs: torch.Tensor | None = None) -> "Draft":
        return cls(tuple(tokens), DraftTree.chain(len(tokens)), probs)

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
