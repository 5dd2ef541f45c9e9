"""ADT-Tree: adjacency-adaptive draft-tree shapes: adjacent initialisation + bisectional adaptation."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from specgen.methods.eagle import ShapePolicy, TreeShape
from specgen.methods.options import AdtOptions


def adapt(depth: int, top_k: int, alpha: float, p: AdtOptions) -> tuple[int, int]:
    """Eq. (2) with the open-interval bounds: deeper and narrower after an acceptance of at least beta, else
    shallower and wider."""
    step = 1 if alpha >= p.beta else -1
    return (min(max(depth + step * p.l_d, p.d_min + 1), p.d_max - 1),
            min(max(top_k - step * p.l_k, p.k_min + 1), p.k_max - 1))


@dataclass
class AdtPolicy(ShapePolicy):
    """ShapePolicy of ADT-Tree over a W-wide raster grid: sequence index s >= n_cond is cell divmod(s - n_cond, W)."""

    params: AdtOptions  # checked options (the paper's LlamaGen values: docs/methods/adt-tree.md)
    grid: int  # W
    n_cond: int = 1
    records: dict[tuple[int, int], tuple[int, int, float]] = field(default_factory=dict)

    def reset(self) -> None:
        self.records = {}
        self.rng = random.Random(self.params.seed)

    def cell(self, index: int) -> tuple[int, int]:
        return divmod(index - self.n_cond, self.grid)

    def shape(self, next_index: int) -> TreeShape:
        """Adjacent initialisation (the left or upper cell's record, adapted; none: d0, k0), or a random start."""
        p, (i, j) = self.params, self.cell(next_index)
        if p.init == "random":  # random initialisation has no acceptance to adapt from
            depth, top_k = self.rng.randint(p.d_min + 1, p.d_max - 1), self.rng.randint(p.k_min + 1, p.k_max - 1)
            return TreeShape(depth, top_k, p.total_tokens)
        order = [(i, j - 1), (i - 1, j)] if p.init == "horizontal" else [(i - 1, j), (i, j - 1)]
        start = next((self.records[c] for c in order if min(c) >= 0 and c in self.records), None)
        depth, top_k = (p.d0, p.k0) if start is None else adapt(*start, p)
        return TreeShape(depth, top_k, p.total_tokens)

    @property
    def largest(self) -> TreeShape:
        """Every shape lies strictly inside the bounds (`adapt`, the random start and `check`'s first tree)."""
        return TreeShape(self.params.d_max - 1, self.params.k_max - 1, self.params.total_tokens)

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        alpha = accepted / shape.depth if shape.depth else 0.0
        for index in range(next_index, next_index + committed):  # every token this tree committed
            self.records[self.cell(index)] = (shape.depth, shape.top_k, alpha)
