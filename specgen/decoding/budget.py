"""Draft budgets: how many draft nodes a row may propose in a step, given how many rows are live.

`FixedBudget` is the method's own setting. `AutoBudget` (see its docstring) picks the cap that
maximises expected committed tokens per unit of verify cost, from a measured cost curve and the
running acceptance rate: speculation pays less as the batch grows, since a verify of B rows x N
nodes costs c(B * N) and c grows faster once the product stops being bound by weight traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class DraftBudget(Protocol):
    """Caps draft sizes by the number of live rows and learns from each row's outcome."""

    def cap(self, live_rows: int) -> int:
        """The most draft nodes one row may propose this step."""
        ...

    def observe(self, draft_size: int, accepted: int) -> None:
        """One row's step: `draft_size` nodes proposed, `accepted` of them accepted."""
        ...


@dataclass
class FixedBudget:
    """The method's own draft size at every batch size."""

    limit: int

    def cap(self, live_rows: int) -> int:
        return self.limit

    def observe(self, draft_size: int, accepted: int) -> None:
        pass


@dataclass
class AutoBudget:
    """Cap k chosen per step to maximise E[tokens per row] / cost of a verify of B x (k + 1) tokens.

    Model: a chain of k draft tokens whose tokens are accepted independently with rate a commits
    E(k) = 1 + a + a^2 + ... + a^k tokens per row per step (the bonus/recovered token included); a verify of
    B rows x (k + 1) tokens costs `cost(B * (k + 1))` (seconds or any unit, measured per model), plus
    `draft_cost * k` of drafting per row (0 for free drafters such as n-gram lookup). The cap is
    argmax_k B * E(k) / (cost(B (k + 1)) + B * draft_cost * k) over k in [0, limit]; k = 0 is batched AR,
    so the policy is never worse than AR in the model's own terms.

    The rate: a = (accepted + prior * weight) / (tried + weight) over the last `window` tried draft tokens (a step
    tries its accepted tokens and the one rejected after them, if any), so a few early rejections do not stop
    drafting. Rows that drafted nothing (no n-gram match) tell nothing and are not counted. A step that chose
    k = 0 learns nothing either, so it forgets the oldest observation: after a run of AR steps the rate drifts
    back to the prior and drafting is tried again.
    """

    limit: int
    cost: Callable[[int], float]  # tokens in one forward -> its cost
    prior: float = 0.5
    weight: float = 8.0  # pseudo-tries behind the prior
    draft_cost: float = 0.0
    window: int = 256
    _history: list[tuple[int, int]] = field(default_factory=list)

    def rate(self) -> float:
        tried = sum(n for n, _ in self._history)
        return (sum(a for _, a in self._history) + self.prior * self.weight) / (tried + self.weight)

    def cap(self, live_rows: int) -> int:
        a = min(self.rate(), 0.999)
        best, best_k, expected = -1.0, 0, 0.0
        for k in range(self.limit + 1):
            expected += a**k  # E(k) = sum_{j <= k} a^j
            speed = live_rows * expected / (self.cost(live_rows * (k + 1)) + live_rows * self.draft_cost * k)
            if speed > best * 1.0001:  # ties go to the shorter draft
                best, best_k = speed, k
        if best_k == 0 and self._history:
            self._history.pop(0)  # nothing will be learnt this step: forget, drifting back to the prior
        return best_k

    def observe(self, draft_size: int, accepted: int) -> None:
        if draft_size == 0:
            return
        self._history.append((accepted + (accepted < draft_size), accepted))  # (tried, accepted)
        while sum(n for n, _ in self._history) > self.window and len(self._history) > 1:
            self._history.pop(0)
