"""The auto draft budget's choice, the cost curve it reads, and the cache-size refusal."""

from __future__ import annotations

import pytest

from specgen.decoding import memory
from specgen.decoding.budget import AutoBudget, FixedBudget
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
