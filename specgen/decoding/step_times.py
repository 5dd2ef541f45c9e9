"""Measured decode-step times per (live rows, draft width): what anchors the `auto` budget's cost curve."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

Model = Callable[[int], list[float]]  # live rows B -> the cost curve's cost of a step of each width at B


@dataclass
class StepTimes:
    """Recent wall times of whole decode steps by live rows B and width k, and the cost estimate they correct."""

    min_steps: int = 2
    memory: int = 128
    keep: int = 16  # steps kept per (B, width)
    clock: int = 0
    _steps: dict[int, dict[int, deque]] = field(default_factory=dict)
    _memo: dict = field(default_factory=dict, repr=False)  # measured / source per row count, until the next step

    def add(self, rows: int, width: int, seconds: float) -> None:
        self.clock += 1
        self._memo.clear()  # a new step: every count's freshness moves
        per_width = self._steps.setdefault(rows, {})
        per_width.setdefault(width, deque(maxlen=self.keep)).append((self.clock, seconds))

    def measured(self, rows: int) -> dict[int, float]:
        """width -> the median seconds of its fresh steps at `rows` live rows (widths with at least `min_steps`):
        one stalled step does not decide."""
        if ("measured", rows) not in self._memo:  # a budget step asks several times, and `source` for every count
            fresh = {k: [s for t, s in steps if self.clock - t < self.memory]
                     for k, steps in self._steps.get(rows, {}).items()}
            self._memo[("measured", rows)] = {k: median(f) for k, f in fresh.items() if len(f) >= self.min_steps}
        return self._memo[("measured", rows)]

    def complete(self, rows: int) -> bool:
        """Whether `rows` has measured batched AR (width 0) and a drafting width."""
        widths = self.measured(rows)
        return 0 in widths and any(k > 0 for k in widths)

    def source(self, rows: int) -> int:
        """The row count whose measurements stand for `rows`: itself once `complete`, else the nearest complete count
        within a quarter of it (at least 1), else `rows` (docs/decoding.md)."""
        if ("source", rows) not in self._memo:  # a complete `rows` is its own nearest
            near = [b for b in self._steps if abs(b - rows) <= max(1, rows // 4) and self.complete(b)]
            self._memo[("source", rows)] = min(near, key=lambda b: (abs(b - rows), b)) if near else rows
        return self._memo[("source", rows)]

    def estimate(self, rows: int, model: Model) -> list[float]:
        """The seconds of a step of each width k = 0, 1, ... at `rows` live rows (`model(B)`: the curve's cost of
        each width at B rows, in any unit); from `source(rows)`'s measurements, scaled by the curve when that is
        another count."""
        src = self.source(rows)
        here = self.measured(src)
        if not here:
            return list(model(rows))
        at_src = anchored(model(src), here)
        if src == rows:
            return at_src
        return [cost * e / m for cost, e, m in zip(model(rows), at_src, model(src))]


def anchored(model: list[float], measured: dict[int, float]) -> list[float]:
    """Each width's measured seconds; between two measured widths, interpolated linearly; below the narrowest or
    above the widest, that one's seconds scaled by the curve, model[k] / model[k']."""
    widths = sorted(measured)
    out = []
    for k, cost in enumerate(model):
        i = bisect.bisect_left(widths, k)
        if i < len(widths) and widths[i] == k:
            out.append(measured[k])
        elif 0 < i < len(widths):
            lo, hi = widths[i - 1], widths[i]
            out.append(measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo))
        else:
            n = widths[0] if i == 0 else widths[-1]
            out.append(measured[n] * cost / model[n])
    return out
