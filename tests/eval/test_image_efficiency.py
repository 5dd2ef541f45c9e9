"""eta of batch-1 image rows (`eval/image_rows.efficiency`): the predicted speedup from tau, the verify's CFG rows
on the measured cost curve and the drafter's time, against the measured speedup."""

from __future__ import annotations

import pytest

from specgen.decoding.stats import DecodeStats
from specgen.eval.image_rows import Image, efficiency

MACHINE = {"cost_rows": [1, 2, 4, 8, 16, 32], "cost": [1.0, 1.1, 1.3, 1.6, 2.2, 3.4], "branches": 2}


def image(stats: DecodeStats, shard: str = "0") -> Image:
    return Image(tokens=[], stats=stats, shard=shard)


def ar_stats() -> DecodeStats:
    return DecodeStats(target_forwards=200, times={"verify": 2.0})  # 0.01 s per AR forward


def tree_stats(**extras) -> DecodeStats:
    # 50 verify steps of 5 tokens per image (10 CFG rows), 2 accepted per step: tau 3; 0.1 s of drafting
    return DecodeStats(steps=50, target_forwards=51, target_tokens=250, accepted=[2] * 50,
                       times={"propose": 0.1, "verify": 0.5}, extras=dict(extras))


def test_efficiency_is_the_speedup_over_what_acceptance_allows():
    got = efficiency([image(tree_stats())], [image(ar_stats())], {"0": MACHINE}, speedup=1.5)
    rel = (1.6 + 0.6 * 2 / 8) / 1.1  # c(2 * 5) by interpolation over c(2): a verify against an AR step
    predicted = 3.0 / (rel + 0.1 / 50 / 0.01)
    assert got["predicted_speedup"] == pytest.approx(predicted, abs=1e-4)
    assert got["efficiency"] == pytest.approx(1.5 / predicted, abs=1e-4)
    assert got["verify_tokens"] == 5.0 and got["draft_cost"] == pytest.approx(0.2)
    # without CFG a verify of 5 tokens is c(5) against c(1)
    one = efficiency([image(tree_stats())], [image(ar_stats())], {"0": {**MACHINE, "branches": 1}}, speedup=1.5)
    assert one["predicted_speedup"] == pytest.approx(3.0 / (1.3 + 0.3 * 1 / 4 + 0.2), abs=1e-4)


@pytest.mark.parametrize("stats, machine", [
    (ar_stats(), MACHINE),  # no drafts
    (tree_stats(skipped_steps=4), MACHINE),  # vvs: its own steps
    (tree_stats(draft_tokens=30), MACHINE),  # mulo-sd
    (tree_stats(), {"conditions": {}}),  # a machine file without a cost curve
])
def test_no_efficiency_where_the_model_does_not_apply(stats, machine):
    assert efficiency([image(stats)], [image(ar_stats())], {"0": machine}, speedup=1.2) == {}
