"""EAGLE-2 dynamic draft trees from a feature drafter, with CFG; the tree's shape comes from a policy.

The drafter network predicts the target's next feature from (feature f_p, token x_{p+1}) pairs:
`net(features [B, S, D], tokens [B, S], positions [B, S], cache, attn_mask=None) -> hidden [B, S, D]`,
where `positions` are the positions of the tokens (so 2D RoPE sees the token's grid cell), and the
target's LM head turns predicted features into logits. Under CFG the drafter runs both branches
(row 0 cond, row 1 uncond) and its logits are combined with the target's scale, as LANTERN does.

Tree construction (EAGLE-2, `topK_genrate`): 1. run the drafter over the newly committed pairs; the
last output gives the root's children = top-k tokens by log-prob. 2. for depth - 1 levels, feed the
current frontier (k nodes; each sees its ancestors through an explicit mask over the drafter cache),
take top-k children per node, score = parent score + child log-prob, keep the global top-k as the
next frontier (a beam); every candidate is recorded. 3. keep the `total_tokens` best recorded nodes
(their ancestors are among them) in recording order, which is topological (methods/eagle_grow.py).
Drafts are deterministic (q = 1 at T > 0, lossless with the tree rejection rule) and use raw CFG
log-probs, as EAGLE-2 does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from specgen.decoding.draft_verify import DrafterBase
from specgen.methods.eagle_grow import TreeShape


class ShapePolicy(Protocol):
    """Chooses each tree's shape and learns from its outcome (fixed for EAGLE-2, adaptive for ADT-Tree)."""

    def reset(self) -> None: ...

    def shape(self, next_index: int) -> TreeShape:
        """Shape of the tree drafting the token with sequence index `next_index` onwards."""
        ...

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        """`accepted` draft tokens were accepted; `committed` tokens (accepted + bonus) were added."""
        ...


@dataclass
class FixedShape:
    """EAGLE-2: the same shape for every tree."""

    tree: TreeShape

    def reset(self) -> None:
        pass

    def shape(self, next_index: int) -> TreeShape:
        return self.tree

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        pass


@dataclass
class EagleTreeDrafter(DrafterBase):
    """One row's EAGLE drafter: the feature drafter, its head and CFG, the tree policy, and the row's state between
    steps (set by the pool that grows every live row's tree together, methods/eagle_batch.py)."""

    net: torch.nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]  # hidden [B, S, D] -> logits [B, S, V] (target's head)
    combine: Callable[[torch.Tensor], torch.Tensor]  # [B, S, V] -> [n, S, V] (CFG or identity)
    policy: ShapePolicy
    max_len: int = 4096
    shapes: list[TreeShape] = field(default_factory=list)  # shape of every proposed tree (stats)
    pending: torch.Tensor | None = None  # [br, m, D]: f of the pairs the next catch-up runs
    last_shape: TreeShape | None = None  # the shape of the tree the next verdict judges (None: no observation)
    last_index: int = 0
    owed: bool = False  # a step ran without drafting: its pairs wait for the next catch-up
    backlog: list[torch.Tensor] = field(default_factory=list)

    def pool(self, make: Callable[[int], "EagleTreeDrafter"]):
        """The DrafterPool that grows every live row's tree together (methods/eagle_batch.py)."""
        from specgen.methods.eagle_batch import EagleBatch  # it builds on this module: a top import is a circle

        return EagleBatch(make)
