"""Draft budgets: how many draft nodes a row may propose in a step, given how many rows are live (docs/decoding.md)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from statistics import median
from typing import Callable, Protocol, Sequence

from specgen.decoding.step_times import StepTimes


class DraftBudget(Protocol):
    """Caps draft depths by the number of live rows and learns from each row's outcome."""

    def cap(self, live_rows: int) -> int:
        """The deepest draft one row may propose this step: tokens along any path from the root (a chain's length, a
        tree's depth; how wide a tree grows is its method's)."""

    def observe(self, nodes: int, depth: int, accepted: int) -> None:
        """One row's step: a draft of `nodes` nodes on `depth` levels proposed, `accepted` of its tokens accepted."""

    def observe_drafter(self, forwards: Sequence[int]) -> None:
        """The drafter forwards of the step the last `cap` sized (none: no drafter model ran), each its rows x tokens:
        an untimed budget costs them (`MeasuredBudget.drafter`), wall times include them already."""

    def observe_step(self, seconds: float) -> None:
        """The wall time of the whole step (propose, verify, accept, commit) that the last `cap` sized."""


@dataclass
class FixedBudget:
    """The method's own draft size at every batch size."""

    limit: int

    def cap(self, live_rows: int) -> int:
        return self.limit

    def observe(self, nodes: int, depth: int, accepted: int) -> None:
        pass

    def observe_drafter(self, forwards: Sequence[int]) -> None:
        pass

    def observe_step(self, seconds: float) -> None:
        pass


@dataclass
class AutoBudget:
    """Cap k per step maximising expected tokens per row over the cost of a B x (1 + k b) verify, b the drafts' nodes
    per level (1 for chains; docs/decoding.md); k = 0 (batched AR) is a candidate, so it is never worse than AR in
    the model's own terms (but for `probe`'s few steps, which let measured times correct a curve that ranks every
    draft below AR)."""

    limit: int
    cost: Callable[[int], float]  # tokens in one forward -> its cost
    # False: plan from the cost curve alone, never from measured step times, so a sampled run's draft sizes (and with
    # them its tokens) depend only on its seed and the stored curve: `--seed` repeats it
    timed: bool = True
    prior: float = 0.5
    weight: float = 8.0  # pseudo-tries behind the prior
    window: int = 256
    times: StepTimes = field(default_factory=StepTimes)
    _history: list[tuple[int, int]] = field(default_factory=list)  # (tried, accepted) per drafting row
    _shape: deque = field(default_factory=deque)  # (nodes, depth) per drafting row, the last `window`
    _offers: list[bool] = field(default_factory=list)  # per row of a step capped above 0: whether it drafted
    _cap: int = 0  # the cap of the step being observed
    _step: tuple[int, int] | None = None  # (live rows, widest draft) so far of the step the cap sized
    _probes: dict[int, list[int]] = field(default_factory=dict)  # row count -> the step clocks of its recent probes

    def rate(self) -> float:
        """The share of tried draft tokens accepted, from the rows that drafted (`weight` pseudo-tries at `prior`)."""
        tried = sum(n for n, _ in self._history)
        return (sum(a for _, a in self._history) + self.prior * self.weight) / (tried + self.weight)

    def drafting(self) -> float:
        """The share of rows that drafted in steps capped above 0 (with one pseudo-row that did)."""
        return (sum(self._offers) + 1) / (len(self._offers) + 1)

    def breadth(self) -> float:
        """Nodes a draft level, over the recent drafting rows (1: chains, and before any draft)."""
        depth = sum(d for _, d in self._shape)
        return sum(n for n, _ in self._shape) / depth if depth else 1.0

    def model(self, live_rows: int) -> list[float]:
        """The curve's cost of a step of each width k = 0 .. limit at `live_rows` rows: k levels of `breadth` nodes."""
        b = self.breadth()
        return [self.cost(live_rows * (1 + k * b)) for k in range(self.limit + 1)]

    def tokens(self, live_rows: int) -> list[float]:
        """Expected tokens a step of each width k = 0 .. limit commits at `live_rows` rows, given that one row drafts
        (else the step is AR whatever the cap): that row and each other's share that drafts gain E(k) - 1."""
        a = min(self.rate(), 0.999)
        gain = [0.0, *accumulate(a**k for k in range(1, self.limit + 1))]  # E(k) - 1, running sums
        rows = 1 + (live_rows - 1) * self.drafting()
        return [live_rows + rows * g for g in gain]

    def best(self, live_rows: int, narrowest: int = 0) -> int:
        """The width from `narrowest` up with the most expected tokens per unit of estimated cost at `live_rows`."""
        tokens = self.tokens(live_rows)
        best, best_k = -1.0, narrowest
        costs = self.times.estimate(live_rows, self.model) if self.timed else self.model(live_rows)
        for k in range(narrowest, len(costs)):
            if tokens[k] / costs[k] > best * 1.0001:  # ties go to the shorter draft
                best, best_k = tokens[k] / costs[k], k
        return best_k

    def cap(self, live_rows: int) -> int:
        best_k = self.best(live_rows)
        if self.timed:
            source = self.times.source(live_rows)
            measured = self.times.measured(source)
            if best_k and 0 not in measured:
                best_k = 0  # batched AR first: the reference the wider widths' measured costs are judged against
            elif not best_k and set(measured) == {0} and self.limit and self.probe(source):
                best_k = self.best(live_rows, narrowest=1)
        if best_k == 0 and self._history:
            self._history.pop(0)  # nothing will be learnt this step: forget, drifting back to the prior
        self._cap, self._step = best_k, (live_rows, 0)
        return best_k

    def probe(self, source: int) -> bool:
        """Whether to try a draft width the curve judges slower than AR: where no drafting width is measured and the
        acceptance learnt is not below the prior, at most `min_steps` steps per `memory` steps at a row count. The
        curve can misjudge a width, and only a measured step corrects it: one timed while a compile shared the cores
        had c(2) = 2.06 (quiet: 1.08), and n-gram never drafted on it."""
        clock = self.times.clock
        recent = [t for t in self._probes.get(source, []) if clock - t < self.times.memory]
        if len(recent) >= self.times.min_steps or self.rate() < self.prior - 1e-9:
            return False
        self._probes[source] = [*recent, clock]
        return True

    def observe(self, nodes: int, depth: int, accepted: int) -> None:
        if self._step is not None:
            rows, width = self._step
            self._step = (rows, max(width, min(depth, self.limit)))
        if self._cap:
            self._offers.append(nodes > 0)
            del self._offers[: -self.window]
        if nodes == 0:
            return  # no proposal: says nothing about acceptance
        self._history.append((accepted + (accepted < depth), accepted))  # (tried, accepted): a path's tokens
        self._shape.append((nodes, depth))
        if len(self._shape) > self.window:
            self._shape.popleft()
        while sum(n for n, _ in self._history) > self.window and len(self._history) > 1:
            self._history.pop(0)

    def observe_drafter(self, forwards: Sequence[int]) -> None:
        pass  # text drafts without a drafter model (n-gram, Jacobi guesses): its cost model is the verify's

    def observe_step(self, seconds: float) -> None:
        if self._step is not None:
            rows, width = self._step
            self.times.add(rows, width, seconds)
            self._step = None


@dataclass
class MeasuredBudget:
    """Per number of live rows B, the measured faster of batched AR (cap 0) and the draft (cap `limit`); not `timed`,
    a step is measured by the cost curve instead of the clock (docs/decoding.md, MeasuredBudget 6.)."""

    limit: int
    probe_share: float = 0.05
    tries: int = 3  # measured steps of each choice at a new row count, and of the other in each later try
    window: int = 10  # measured steps a choice's rate is taken over
    far: float = 0.75  # a choice below this share of the other's rate is "far behind" (its tries back off)
    cost: Callable[[int], float] | None = None  # c(m) of the target's forward over m rows x tokens (5. predicting)
    rows_per_sequence: int = 1  # forward rows of one sequence (2 under CFG)
    # False (needs `cost`): a step costs c(tokens it verified) and its drafter forwards, never its wall time, so a
    # sampled run's choices (and with them its draws) depend only on its seed and the stored curves: `--seed` repeats it
    timed: bool = True
    # a drafter forward over m rows x tokens, in `cost`'s unit (`cost.relative`): what an untimed step pays for the
    # drafter forwards its pool reported (None: a method without a drafter model, whose steps report none)
    drafter: Callable[[int], float] | None = None
    _steps: dict[tuple[int, int], deque] = field(default_factory=dict)  # (B, cap) -> its last measured (tokens, s)
    _count: dict[tuple[int, int], int] = field(default_factory=dict)  # (B, cap) -> steps measured
    _since: dict[int, float] = field(default_factory=dict)  # B -> seconds run at B since the other was tried
    _share: dict[int, float] = field(default_factory=dict)  # B -> the current probe share at B
    _leader: dict[int, int] = field(default_factory=dict)  # B -> the choice that led when the other was tried
    _probe: dict[int, int] = field(default_factory=dict)  # B -> steps of the running try still to come
    _ratio: dict[int, float] = field(default_factory=dict)  # B -> draft rate / AR rate (measured side by side)
    _acc: dict[int, list] = field(default_factory=dict)  # B -> the running try's measured (tokens, seconds) steps
    # and the wall seconds of all its steps (the unmeasured first one too)
    _try_cost: dict[int, float] = field(default_factory=dict)  # B -> wall seconds of the last whole try
    _verify: dict[tuple[int, int], list] = field(default_factory=dict)  # (B, cap) -> [tokens verified, rows]
    _last: int | None = None  # the cap of the previous step (any B): a step after a switch is not measured
    # [live rows, cap, tokens, measured, verified, rows, drafter forwards] of the step
    _open: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.timed and self.cost is None:
            raise ValueError("an untimed MeasuredBudget costs its steps by a cost curve: pass cost=")

    def rate(self, live_rows: int, cap: int) -> float | None:
        """Tokens per second of `cap`-sized steps at `live_rows` rows so far (None: never measured)."""
        steps = self._steps.get((live_rows, cap))
        return steady_rate(steps) if steps else None

    def borrow(self, b: int) -> None:
        """Start a new row count from the nearest measured within a quarter (or a row): tokens scaled, seconds kept."""
        if (b, self.limit) in self._steps or (b, 0) in self._steps:  # seen before: measured, or being measured
            return
        known = {k for k, c in self._steps if min(self._count.get((k, x), 0) for x in (self.limit, 0)) >= self.tries}
        if not known:
            return
        near = min(known, key=lambda k: (abs(k - b), k))
        if abs(near - b) > max(1, b // 4):  # too far: speculation pays differently there
            return
        for c in (self.limit, 0):
            self._steps[(b, c)] = deque(((t * b / near, s) for t, s in self._steps[(near, c)]), self.window)
            self._count[(b, c)] = self.tries
        for table in (self._ratio, self._share):  # what the near count found, and how often it tries
            if near in table:
                table[b] = table[near]

    def predict(self, b: int) -> tuple[float, float] | None:
        """(draft rate / AR rate, a draft step's seconds) at b rows from the nearest count where both were measured,
        scaled by the cost curve (5. in the class docstring); None without a curve or such a count."""
        known = [k for k in self._ratio if (k, self.limit) in self._steps and self._verify.get((k, self.limit))]
        if self.cost is None or not known:
            return None
        k = min(known, key=lambda x: (abs(x - b), x))
        verified, rows = self._verify[(k, self.limit)]
        c, m = self.cost, self.rows_per_sequence
        tree = c(m * b * verified / rows) / c(m * k * verified / rows)  # a draft step at b over one at k
        ar = c(m * b) / c(m * k)
        step = typical_seconds(self._steps[(k, self.limit)]) * tree
        return self._ratio[k] * ar / tree, step

    def cap(self, live_rows: int) -> int:
        b, draft, ar = live_rows, self.limit, 0
        self.borrow(b)
        if b not in self._ratio and not any((b, c) in self._count for c in (draft, ar)):
            guess = self.predict(b)
            if guess is not None and guess[0] < self.far:  # predicted far behind: AR leads, as if measured so
                self._ratio[b], self._share[b], self._leader[b] = guess[0], self.probe_share / 2, ar
                self._try_cost[b], self._since[b] = (1 + self.tries) * guess[1], 0.0
        if b not in self._ratio and min(self._count.get((b, c), 0) for c in (draft, ar)) < self.tries:
            # measure both first, the draft first
            choice = draft if self._count.get((b, draft), 0) < self.tries else ar
            self._since[b] = 0.0  # the time to the first try counts from the end of measuring
        else:
            if b not in self._ratio:  # measuring just ended: it was the first try, and backs off as one
                self._ratio[b] = self.rate(b, draft) / self.rate(b, ar)
                self._share[b] = self.probe_share / 2 if min(self._ratio[b], 1 / self._ratio[b]) < self.far \
                    else self.probe_share
            ratio = self._ratio[b]
            best = draft if ratio >= 1 else ar
            other = draft + ar - best
            if self._leader.setdefault(b, best) != best:  # the last try changed the choice: watch closely again
                self._leader[b], self._share[b] = best, self.probe_share
            share = self._share.setdefault(b, self.probe_share)
            try_cost = self._try_cost.get(b)
            if try_cost is None:  # no whole try yet: 1 + `tries` of its typical steps
                try_cost = (1 + self.tries) * typical_seconds(self._steps[(b, other)])
            if self._probe.get(b, 0) > 0:  # a try's measured steps
                choice, self._probe[b] = other, self._probe[b] - 1
            elif try_cost <= share * self._since.get(b, 0.0) and self.rate(b, best) is not None:  # a try is due:
                # 1 + `tries` steps (once the leader has a rate at b to compare it with)
                choice, self._probe[b], self._since[b], self._acc[b] = other, self.tries, 0.0, [[], 0.0]
            else:
                choice = best
        self._open = [b, choice, 0, choice == self._last, 0, 0, []]
        self._last = choice
        return choice

    def observe(self, nodes: int, depth: int, accepted: int) -> None:
        if self._open:
            self._open[2] += accepted + 1  # the row's accepted tokens and its bonus / corrected token
            self._open[4] += nodes + 1  # the row's tokens in the verify (root + draft)
            self._open[5] += 1

    def observe_drafter(self, forwards: Sequence[int]) -> None:
        if self._open:
            self._open[6].extend(forwards)

    def observe_step(self, seconds: float) -> None:
        if not self._open or (self.timed and seconds <= 0):
            return
        b, choice, tokens, measured, verified, rows, forwards = self._open
        if not self.timed:
            seconds = self.untimed(verified, forwards)
        self._open = []
        seen = self._verify.setdefault((b, choice), [0, 0])
        seen[0], seen[1] = seen[0] + verified, seen[1] + rows
        self._since[b] = self._since.get(b, 0.0) + seconds
        if b in self._acc and choice != self._leader.get(b, choice):  # a step of a try (its unmeasured first too)
            acc = self._acc[b]
            acc[1] += seconds
            if measured:
                acc[0].append((tokens, seconds))
            if not self._probe.get(b):
                tried, self._try_cost[b] = self._acc.pop(b)
                if tried:  # a measured step in it (tries >= 1)
                    # a whole try against the leader's recent rate: both measured at about the same point of the
                    # sequences (a rate measured long ago, earlier in every sequence, where steps were cheaper, would
                    # flatter it)
                    r = steady_rate(tried) / self.rate(b, self._leader[b])  # the other's speed relative to the leader
                    self._ratio[b] = 0.5 * self._ratio[b] + 0.5 * (r if choice == self.limit else 1 / r)
                    # far behind: the next try waits twice as long; close (or ahead): as long as ever
                    share = self._share.get(b, self.probe_share)
                    self._share[b] = max(share / 2, self.probe_share / 64) if r < self.far else self.probe_share
        if measured:
            self._steps.setdefault((b, choice), deque(maxlen=self.window)).append((tokens, seconds))
            self._count[(b, choice)] = self._count.get((b, choice), 0) + 1

    def untimed(self, verified: int, forwards: Sequence[int]) -> float:
        """An untimed step's cost: the verify of `verified` tokens a sequence-row at c, and each drafter forward of
        `forwards` (rows x tokens) at the drafter's curve in c's unit (6.)."""
        if forwards and self.drafter is None:
            raise ValueError("an untimed MeasuredBudget costs a drafter's forwards by its curve: pass drafter=")
        return self.cost(self.rows_per_sequence * verified) + sum(self.drafter(m) for m in forwards)


def steady_rate(steps) -> float:
    """Tokens per second of measured (tokens, seconds) steps: mean tokens over median seconds (a stall is ignored)."""
    return sum(t for t, _ in steps) / len(steps) / typical_seconds(steps)


def typical_seconds(steps) -> float:
    """The median seconds of measured (tokens, seconds) steps: a step's cost without one-off stalls."""
    return median([s for _, s in steps])
