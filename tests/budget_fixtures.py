"""A measured budget's step times injected instead of the wall clock, for tests that must not depend on timing."""

from __future__ import annotations

from typing import Callable

from specgen.decoding.budget import MeasuredBudget

CAP, OBSERVE_STEP = MeasuredBudget.cap, MeasuredBudget.observe_step  # the originals: a second patch replaces the first


def step_times(monkeypatch, seconds: Callable[[int], float]) -> None:
    """Every `MeasuredBudget` observes `seconds(cap)` as the time of a step its `cap` sized, whatever the clock said."""

    def capped(self, live_rows: int) -> int:
        self.injected_cap = CAP(self, live_rows)
        return self.injected_cap

    monkeypatch.setattr(MeasuredBudget, "cap", capped)
    monkeypatch.setattr(MeasuredBudget, "observe_step", lambda self, s: OBSERVE_STEP(self, seconds(self.injected_cap)))
