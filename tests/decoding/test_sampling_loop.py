"""End to end through the decode loop: drafted sampling preserves the target's joint distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specgen.config import load_config
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.eval.text_bench import TextBenchConfig
from specgen.generate.text import TextGenConfig
from specgen.methods.options import JacobiOptions
from specgen.methods.text import EmptyDrafter, JacobiDrafter
from tests.conftest import decode
from tests.conftest import method_drafter, tiny_model


def joint(model, drafter, n=1000, seed=0):
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(seed)
    target = ModelTarget(model)
    return Counter(tuple(decode(target, drafter, [1, 2, 3], 3, params, generator=g).tokens) for _ in range(n))


@pytest.mark.slow
def test_jacobi_sampling_matches_ar_joint_distribution():
    model = tiny_model(5, vocab_size=4, dim=16)
    for p in model.parameters():  # flatter logits so many sequences have mass
        p.data.mul_(0.5)
    ar, jac = joint(model, EmptyDrafter()), joint(model, JacobiDrafter(JacobiOptions(3)), seed=1)
    ar2 = joint(model, EmptyDrafter(), seed=2)
    keys = set(ar) | set(jac) | set(ar2)
    tv = 0.5 * sum(abs(ar[k] - jac[k]) for k in keys) / 1000
    tv_noise = 0.5 * sum(abs(ar[k] - ar2[k]) for k in keys) / 1000
    assert tv < max(0.1, 2.5 * tv_noise), (tv, tv_noise)


def test_a_drafter_runs_again_after_a_decode():
    """A drafter's own state (Jacobi's fill tokens, pcLLM's recycling pool) never shadows the loop's hooks on it."""
    target = ModelTarget(tiny_model(5, vocab_size=16, dim=16))
    for drafter in (JacobiDrafter(JacobiOptions(3)), method_drafter("pcllm-mr")):
        first = decode(target, drafter, [1, 2, 3], 6, SamplingParams()).tokens
        assert decode(target, drafter, [1, 2, 3], 6, SamplingParams()).tokens == first


def test_recipes_load():
    gen = load_config(TextGenConfig, "recipes/tiny/generate-text.yaml")
    assert gen.method == "ngram" and gen.method_options["num_draft"] == 4
    bench = load_config(TextBenchConfig, "recipes/tiny/bench-humaneval.yaml", ["limit=3"])
    assert bench.limit == 3 and "hf" in bench.methods


def test_biased_drafting_would_be_caught():
    """Sanity check of the test's power: always taking the greedy token is far from sampling."""
    model = tiny_model(5, vocab_size=4, dim=16)
    for p in model.parameters():
        p.data.mul_(0.5)
    ar = joint(model, EmptyDrafter(), n=200)
    g = Counter(tuple(decode(ModelTarget(model), EmptyDrafter(), [1, 2, 3], 3, SamplingParams()).tokens)
                for _ in range(1))
    greedy = Counter({k: 200 for k in g})
    tv = 0.5 * sum(abs(ar[k] - greedy[k]) for k in set(ar) | set(greedy)) / 200
    assert tv > 0.3, tv
