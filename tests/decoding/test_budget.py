"""The auto draft budget's choice, the cost curve it reads, and the cache-size refusal."""

from __future__ import annotations

import pytest

from specgen.decoding import memory
from specgen.decoding.budget import AutoBudget, FixedBudget, MeasuredBudget
from specgen.decoding.cache import KVCache
from specgen.decoding.cost import CostCurve, measure_cost
from specgen.errors import UsageError
from tests.conftest import tiny_model


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve((1, 2, 4), (1.0, 1.2, 2.0))
    assert c(1) == 1.0 and c(2) == 1.2 and c(3) == pytest.approx(1.6)
    assert c(6) == pytest.approx(2.8)  # the last slope, 0.4 per row
    assert "c(4)=2.00" in c.describe()


def test_measured_cost_is_relative_to_one_token_and_never_falls():
    curve = measure_cost(tiny_model(0), rows=(1, 2, 8, 64), rounds=1)
    assert curve.rows == (1, 2, 8, 64) and all(c > 0 for c in curve.cost)
    assert list(curve.cost) == sorted(curve.cost) and curve.cost[0] <= 1.0


def test_auto_budget_drafts_when_verification_is_cheap_and_acceptance_high():
    flat = AutoBudget(8, CostCurve((1, 1024), (1.0, 1.0)), prior=0.9)
    assert flat.cap(1) == 8  # free verification: draft as much as allowed


def test_auto_budget_is_batched_ar_when_each_token_costs_a_forward():
    linear = AutoBudget(8, CostCurve((1, 1024), (1.0, 1024.0)), prior=0.9)
    assert linear.cap(1) == 0 and linear.cap(16) == 0  # k tokens cost k forwards and E(k) < k + 1


def test_auto_budget_shrinks_as_the_batch_fills_the_product():
    """c(m) flat up to 16 rows, then linear: one row drafts, a batch of 16 does not."""
    knee = AutoBudget(8, CostCurve((1, 16, 1024), (1.0, 1.0, 64.0)), prior=0.7)
    assert knee.cap(1) >= 4 and knee.cap(16) == 0
    assert knee.cap(4) <= knee.cap(1)


def test_auto_budget_learns_the_acceptance_rate_and_retries_after_ar_steps():
    b = AutoBudget(8, CostCurve((1, 2, 4, 8, 16), (1.0, 1.3, 1.8, 2.8, 5.0)), prior=0.9)
    before = b.cap(1)
    b.observe(4, 0)
    assert b.rate() == pytest.approx(7.2 / 9) and b.cap(1) > 0  # one rejection does not stop drafting
    for _ in range(50):
        b.observe(4, 0)  # every draft rejected at its first token: the rate falls towards 0
    low = b.rate()
    assert low < 0.15 and b.cap(1) == 0 < before  # an AR step: it forgets the oldest rejection
    forgot = b.rate()
    assert forgot > low
    b.observe(0, 0)  # an empty draft says nothing about acceptance
    assert b.rate() == forgot
    steps = 0
    while b.cap(1) == 0:  # AR steps forget old observations until drafting is worth a try again
        steps += 1
    assert 0 < steps <= 50 and b.rate() > low
    assert FixedBudget(5).cap(100) == 5


def test_a_cache_that_cannot_fit_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 10 * 2**20)  # 10 MiB free
    with pytest.raises(UsageError, match=r"needs 256.0 MiB but 10.0 MiB is free: at most 2 rows of 4096 slots fit"):
        KVCache.allocate(2, 64, 2, 4096, 32)  # K + V: 4 MiB per row, 256 MiB in all; 80% of 10 MiB holds 2 rows
    assert KVCache.allocate(2, 1, 2, 4096, 32).batch == 1


def run_steps(budget: MeasuredBudget, live_rows: int, steps: int, seconds_of, accepted_of) -> list[int]:
    """Drive a budget like the loop does: cap, one observe per row, the step's time; the caps it chose."""
    caps = []
    for _ in range(steps):
        cap = budget.cap(live_rows)
        for _ in range(live_rows):
            budget.observe(cap, accepted_of(cap))
        budget.observe_step(seconds_of(cap, live_rows))
        caps.append(cap)
    return caps


def test_measured_budget_keeps_the_faster_choice_per_batch_size_and_probes_the_other():
    # a tree step commits 3 tokens per row, an AR step 1: at B = 1 the tree makes 3 tokens/s and AR 2; at B = 8 the
    # tree 6 and AR 13.3
    seconds = {(1, 16): 1.0, (1, 0): 0.5, (8, 16): 4.0, (8, 0): 0.6}
    budget = MeasuredBudget(16, probe_every=4)
    caps1 = run_steps(budget, 1, 12, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    assert caps1[:2] == [16, 0]  # both measured first, the draft first
    assert caps1[2:] == [0 if (i + 3) % 4 == 0 else 16 for i in range(10)]  # tree (3 tok/s) over AR (2); probes AR
    caps8 = run_steps(budget, 8, 12, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    assert caps8[:2] == [16, 0]
    assert caps8[2:] == [16 if (i + 3) % 4 == 0 else 0 for i in range(10)]  # AR (13.3 tok/s) over the tree (6)


def test_measured_budget_follows_a_change_in_acceptance():
    budget = MeasuredBudget(16, probe_every=4, decay=0.5)
    good = run_steps(budget, 1, 8, lambda cap, b: 1.0, lambda cap: 3 if cap else 0)
    assert good[2:] == [16, 0, 16, 16, 16, 0]  # the tree (3 tokens/s) over AR (1); AR probed at steps 4 and 8
    # the images' flat region ends: the tree commits 1 token per step and costs 2 s, AR 1 token in 1 s
    bad = run_steps(budget, 1, 16, lambda cap, b: 2.0 if cap else 1.0, lambda cap: 0)
    assert bad[-8:].count(0) == 6  # AR now, the tree probed once in 4 steps
