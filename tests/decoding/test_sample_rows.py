"""sample_rows (inverse-CDF draws used for drafter candidates) follows each row's distribution."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from specgen.decoding.sampling import sample_rows


# the chi-square quantile keeps its false-alarm rate at any n; the larger sample (more power) runs under `slow`
@pytest.mark.parametrize("n", [5000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_rows_follow_their_distributions_and_skip_zero_ids(n):
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0],
                          [0.1, 0.0, 0.6, 0.0, 0.0, 0.3]])  # [R, V], zeros at both ends too
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(probs)
    for _ in range(n):
        for r, t in enumerate(sample_rows(probs, g)):
            counts[r, t] += 1
    assert counts[probs == 0].sum() == 0
    for r in range(2):
        support = probs[r] > 0
        expected = probs[r][support] * n
        stat = float(((counts[r][support] - expected) ** 2 / expected).sum())
        assert stat < chi2.ppf(0.999, int(support.sum()) - 1)


def test_a_uniform_at_the_total_falls_back_to_the_last_positive_id(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, 1))  # u rounds up to the total
    assert sample_rows(torch.tensor([[0.25, 0.75, 0.0, 0.0]]), None) == [1]
