"""Measured decode-step times per (live rows, draft width): what anchors the `auto` budget's cost curve."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from statistics import median


@dataclass
class StepTimes:
    """Recent wall times of whole decode steps, keyed by the number of live rows B and the step's width k (its
    widest draft), and the cost estimate they correct.

    The cost curve times one row's forward over m tokens after a short cache. A batched step also attends over
    B longer caches, pads ragged rows and drafts, so the curve can misjudge what a wider verify adds at large B (at
    2 threads it under-costed drafting at batch 16, and the curve-only budget drafted where drafting lost:
    docs/results/batching.md). `estimate` keeps what was measured at B and fills the widths between:
    1. a width with `min_steps` fresh steps at B: their median seconds (and, for `tokens`, their mean tokens);
    2. a width between two measured ones: interpolated linearly in k between them;
    3. a width below the narrowest or above the widest measured one: that one's seconds scaled by the curve,
       model(k) / model(k');
    4. nothing measured at B: the curve alone.
    Step 3 keeps the curve's shape, the very thing that can be wrong, so a budget should measure width 0 (batched AR)
    at each B before trusting the rest (AutoBudget does). A step stays fresh for `memory` steps: a width no longer
    chosen expires, and the estimate for it falls back to steps 2-3, so it is tried again if they favour it (a
    step's cost drifts as caches grow and rows change).
    """

    min_steps: int = 2
    memory: int = 128
    keep: int = 16  # steps kept per (B, width)
    clock: int = 0
    _steps: dict[int, dict[int, deque]] = field(default_factory=dict)

    def add(self, rows: int, width: int, seconds: float, tokens: int) -> None:
        self.clock += 1
        per_width = self._steps.setdefault(rows, {})
        per_width.setdefault(width, deque(maxlen=self.keep)).append((self.clock, seconds, tokens))

    def measured(self, rows: int) -> dict[int, Measure]:
        """width -> its fresh steps at `rows` live rows (widths with at least `min_steps`): the median seconds (one
        stalled step does not decide) and the mean tokens committed (they vary from step to step)."""
        out = {}
        for k, steps in self._steps.get(rows, {}).items():
            fresh = [(s, n) for t, s, n in steps if self.clock - t < self.memory]
            if len(fresh) >= self.min_steps:
                out[k] = Measure(median(s for s, _ in fresh), sum(n for _, n in fresh) / len(fresh))
        return out

    def estimate(self, rows: int, model: list[float]) -> list[float]:
        """The seconds of a step of each width k = 0 .. len(model) - 1 at `rows` live rows (`model`: the curve's
        cost of each, in any unit)."""
        here = {k: m.seconds for k, m in self.measured(rows).items()}
        if not here:
            return list(model)
        widths = sorted(here)
        out = []
        for k, cost in enumerate(model):
            i = bisect.bisect_left(widths, k)
            if i < len(widths) and widths[i] == k:
                out.append(here[k])
            elif 0 < i < len(widths):
                lo, hi = widths[i - 1], widths[i]
                out.append(here[lo] + (here[hi] - here[lo]) * (k - lo) / (hi - lo))
            else:
                n = widths[0] if i == 0 else widths[-1]
                out.append(here[n] * cost / model[n])
        return out

    def tokens(self, rows: int, expected: list[float]) -> list[float]:
        """Tokens a step of each width commits at `rows` live rows: measured where a width ran; else `expected[k]`
        (the acceptance model's) times what the nearest drafting width measured over what the model expected of it
        (the model assumes every row drafts k tokens; an n-gram row without a match drafts none)."""
        here = self.measured(rows)
        out = [here[k].tokens if k in here else e for k, e in enumerate(expected)]
        drafting = [k for k in here if k > 0]
        if drafting:
            for k, e in enumerate(expected):
                if k > 0 and k not in here:
                    n = min(drafting, key=lambda w: (abs(w - k), w))
                    out[k] = e * here[n].tokens / expected[n]
        return out


@dataclass(frozen=True)
class Measure:
    """A width's fresh steps at one row count."""

    seconds: float  # median wall time of a step
    tokens: float  # mean tokens committed by a step (all rows)
