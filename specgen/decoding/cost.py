"""The measured cost curve c(m) of a forward over m new tokens, for the `auto` draft budget.

A decode step's cost on a CPU is mostly its products with the model's weights (attention over the
cache is the same per row whatever the draft size). So c(m) is measured as one pass of m-row products
through every linear layer of the model, in the layout it decodes with (packed / kernel choice included),
at the current thread count, for m in `ROWS`; between measured points it is interpolated linearly, and
past the last it grows linearly with the last slope. Relative units: c(1) = 1.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import torch
from torch import nn

from specgen.models.quantize import QuantizedLinear

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class CostCurve:
    """c(m) at measured row counts (ascending), relative to one row."""

    rows: tuple[int, ...]
    cost: tuple[float, ...]

    def __call__(self, m: int) -> float:
        i = bisect.bisect_left(self.rows, m)
        if i < len(self.rows) and self.rows[i] == m:
            return self.cost[i]
        if i == 0:
            return self.cost[0]
        if i == len(self.rows):
            i -= 1  # extrapolate with the last segment's slope
        r0, r1, c0, c1 = self.rows[i - 1], self.rows[i], self.cost[i - 1], self.cost[i]
        return c0 + (c1 - c0) * (m - r0) / (r1 - r0)

    def describe(self) -> str:
        return ", ".join(f"c({r})={c:.2f}" for r, c in zip(self.rows, self.cost))


@torch.inference_mode()
def measure_cost(module: nn.Module, rows: tuple[int, ...] = ROWS, rounds: int = 3) -> CostCurve:
    """Best-of-`rounds` time of an m-row pass over `module`'s linear layers (each weight once), relative to m = 1."""
    linears = list({id(getattr(lin, "qweight", getattr(lin, "weight", None))): lin for lin in module.modules()
                    if isinstance(lin, (nn.Linear, QuantizedLinear))}.values())  # quantized targets: their own layers
    weight = next(module.parameters())  # the activation dtype (a quantized model's norms; else the weights')
    inputs = {lin.in_features: torch.randn(max(rows), lin.in_features, dtype=weight.dtype, device=weight.device)
              for lin in linears}

    def one_pass(m: int) -> float:
        t = time.perf_counter()
        for lin in linears:
            lin(inputs[lin.in_features][:m])
        return time.perf_counter() - t

    for m in rows:  # warm-up: every kernel and weight touched once
        one_pass(m)
    best = {m: min(one_pass(m) for _ in range(rounds)) for m in rows}
    return CostCurve(tuple(rows), tuple(best[m] / best[rows[0]] for m in rows))
