"""Draft budgets: how many draft nodes a row may propose in a step, given how many rows are live.

`FixedBudget` is the method's own setting. `AutoBudget` (see its docstring) picks the cap that
maximises expected committed tokens per unit of verify cost, from a measured cost curve and the
running acceptance rate: speculation pays less as the batch grows, since a verify of B rows x N
nodes costs c(B * N) and c grows faster once the product stops being bound by weight traffic.
`MeasuredBudget` (draft trees) picks between batched AR and the method's own tree from the throughput
each has measured at the current number of live rows: a tree's cost is mostly its drafter's levels,
which the verify cost curve does not see.
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

    def observe_step(self, seconds: float) -> None:
        """The wall time of the whole step (propose, verify, accept, commit) that the last `cap` sized."""
        ...


@dataclass
class FixedBudget:
    """The method's own draft size at every batch size."""

    limit: int

    def cap(self, live_rows: int) -> int:
        return self.limit

    def observe(self, draft_size: int, accepted: int) -> None:
        pass

    def observe_step(self, seconds: float) -> None:
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

    def observe_step(self, seconds: float) -> None:
        pass


@dataclass
class MeasuredBudget:
    """Per number of live rows B, the faster of batched AR (cap 0) and the method's own draft (cap `limit`).

    Model: none beyond measurement. Each choice's throughput at B (tokens committed by all rows per second of
    the whole step, drafting included) is a running mean with weight `decay` on the past; the first steps at a
    new B try the draft, then AR, then keep the faster, and every `probe_every`-th step at B tries the other
    once so a changed acceptance rate (an image's flat regions, a row mix) is noticed. So at every batch size
    the loop runs at about the better of batched AR and the fixed setting, less the probes' share (1 step in
    `probe_every`). For draft trees: the drafter's levels are most of a tree's cost and differ per
    machine (a launch-bound GPU, a CPU), which the verify cost curve of `AutoBudget` does not capture.

    Lossless either way (AR is the empty draft). Greedy outputs do not depend on it; sampled outputs do, by
    timing, since a step's draft decides how a row's random stream is consumed (each row keeps the target's
    distribution).
    """

    limit: int
    probe_every: int = 16
    decay: float = 0.7
    _rate: dict[tuple[int, int], float] = field(default_factory=dict)  # (live rows, cap) -> tokens per second
    _steps: dict[int, int] = field(default_factory=dict)  # live rows -> steps sized at that count
    _open: list = field(default_factory=list)  # [live rows, cap, tokens] of the step being measured

    def cap(self, live_rows: int) -> int:
        step = self._steps[live_rows] = self._steps.get(live_rows, 0) + 1
        draft, ar = self._rate.get((live_rows, self.limit)), self._rate.get((live_rows, 0))
        if draft is None or ar is None:
            choice = self.limit if draft is None else 0  # measure both first, the draft first
        else:
            best, other = (self.limit, 0) if draft >= ar else (0, self.limit)
            choice = other if step % self.probe_every == 0 else best
        self._open = [live_rows, choice, 0]
        return choice

    def observe(self, draft_size: int, accepted: int) -> None:
        if self._open:
            self._open[2] += accepted + 1  # the row's accepted tokens and its bonus / corrected token

    def observe_step(self, seconds: float) -> None:
        if not self._open or seconds <= 0:
            return
        b, choice, tokens = self._open
        old, new = self._rate.get((b, choice)), tokens / seconds
        self._rate[(b, choice)] = new if old is None else self.decay * old + (1 - self.decay) * new
        self._open = []
