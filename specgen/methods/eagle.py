"""EAGLE-2 dynamic draft trees from a feature drafter, with CFG; a policy picks each tree's shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specgen.decoding.draft_verify import DrafterBase
from specgen.methods.eagle_batch import EagleBatch
from specgen.methods.eagle_grow import TreeShape


class ShapePolicy:
    """Chooses each tree's shape and learns from its outcome (fixed for EAGLE-2, adaptive for ADT-Tree); this base
    learns nothing."""

    def reset(self) -> None:
        pass

    def shape(self, next_index: int) -> TreeShape:
        """Shape of the tree drafting the token with sequence index `next_index` onwards."""
        raise NotImplementedError

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        """`accepted` draft tokens were accepted; `committed` tokens (accepted + bonus) were added."""


@dataclass
class FixedShape(ShapePolicy):
    """EAGLE-2: the same shape for every tree."""

    tree: TreeShape

    def shape(self, next_index: int) -> TreeShape:
        return self.tree


@dataclass
class EagleTreeDrafter(DrafterBase):
    """One row's EAGLE drafter: the feature drafter, its head and CFG, the tree policy, and the row's state between
    steps (set by the pool that grows every live row's tree together, methods/eagle_batch.py)."""

    net: torch.nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]  # hidden [B, S, D] -> logits [B, S, V] (target's head)
    combine: Callable[[torch.Tensor], torch.Tensor]  # [B, S, V] -> [n, S, V] (CFG or identity)
    policy: ShapePolicy
    max_len: int = 4096
    guidance: float = 1.0  # the CFG scale `combine` applies: a captured tree growth bakes it in, so it keys the capture
    pending: torch.Tensor | None = None  # [br, m, D]: f of the pairs the next catch-up runs
    last_shape: TreeShape | None = None  # the shape of the tree the next verdict judges (None: no observation)
    last_index: int = 0
    owed: bool = False  # a step ran without drafting: its pairs wait for the next catch-up
    backlog: list[torch.Tensor] = field(default_factory=list)  # [br, a + 1, D] pairs of the owed steps, in order

    def batch_pool(self, make: Callable[[int], "EagleTreeDrafter"]):
        """The DrafterPool that grows every live row's tree together (methods/eagle_batch.py)."""
        return EagleBatch(make)
