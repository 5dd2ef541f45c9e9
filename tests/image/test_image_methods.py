"""Image methods on tiny random models: greedy EAGLE-2 / ADT-Tree equal AR under CFG; ADT rule; LANTERN bound."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.image.target import CFGTarget
from specgen.methods.adt_tree import AdtPolicy, adapt
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.options import AdtOptions
from specgen.methods.text import EmptyDrafter
from tests.image.helpers import TinyEagle, tiny_image_gpt

GRID = 4


def drafter(model, target, policy):
    net = TinyEagle(model).eval()
    return EagleTreeDrafter(net, model.output, policy, max_len=64, guidance=target.cfg_scale)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("label", [0, 2])
def test_eagle2_and_adt_tree_greedy_equal_ar(cfg_scale, label):
    model = tiny_image_gpt(label)
    target = CFGTarget(model, cfg_scale)
    n = GRID * GRID
    ar = decode(target, EmptyDrafter(), [label], n, SamplingParams()).tokens
    assert len(ar) == n
    eagle = decode(target, drafter(model, target, FixedShape(TreeShape(3, 4, 12))), [label], n, SamplingParams())
    assert eagle.tokens == ar
    assert eagle.stats.steps < n  # trees were verified (and the drafter's own draws were accepted sometimes)
    adt_policy = AdtPolicy(AdtOptions(d0=2, k0=4, l_k=1, k_min=1, k_max=8, total_tokens=10), GRID)
    adt = decode(target, drafter(model, target, adt_policy), [label], n, SamplingParams())
    assert adt.tokens == ar


def test_drafter_that_copies_the_target_is_fully_accepted():
    """An oracle drafter (the target itself) is accepted at every level: tree masks and positions line up."""
    model = tiny_image_gpt(3)
    target = CFGTarget(model, 2.0)
    label = 1

    class Oracle(torch.nn.Module):
        graphs = None

        def new_cache(self, batch, max_len):
            return model.new_cache(batch, max_len)

        def forward(self, features, tokens, positions, cache=None, tree_mask=None, attn_mask=None):
            if cache.lengths[0] == 0:  # the image's first catch-up: the condition position first, as in the target
                target.prefill(torch.tensor([[label]]), cache)
            return model.hidden_states(model.tok_embeddings(tokens), positions, cache, tree_mask, attn_mask=attn_mask)

    depth = 3
    d = EagleTreeDrafter(Oracle(), model.output, FixedShape(TreeShape(depth, 2, 8)), max_len=64,
                         guidance=target.cfg_scale)
    res = decode(target, d, [label], GRID * GRID, SamplingParams())
    ar = decode(target, EmptyDrafter(), [label], GRID * GRID, SamplingParams()).tokens
    assert res.tokens == ar
    full = [a for a, size in zip(res.stats.accepted, res.stats.depths) if size == depth]
    assert full and all(a == depth for a in full)  # every full-depth tree accepted all its levels


def test_adapt_rule_follows_equation_2_and_bounds():
    p = AdtOptions(beta=1.0, l_d=1, l_k=10, d_min=0, d_max=10, k_min=3, k_max=40, d0=4, k0=10)
    assert adapt(4, 10, 1.0, p) == (5, 4)  # positive: deeper, narrower (k clamped to k_min + 1 = 4)
    assert adapt(4, 10, 0.5, p) == (3, 20)  # negative: shallower, wider
    assert adapt(9, 30, 1.0, p) == (9, 20)  # depth stays below d_max = 10
    assert adapt(1, 35, 0.0, p) == (1, 39)  # depth stays above d_min = 0, k below k_max = 40


def test_adt_policy_scripted_acceptances():
    pol = AdtPolicy(AdtOptions(d0=4, k0=10, l_k=10, k_min=3, k_max=40), 4)
    pol.reset()
    # first tree drafts index 2 (cell (0, 1)); no record -> defaults
    s1 = pol.shape(2)
    assert (s1.depth, s1.top_k) == (4, 10)
    pol.observe(2, s1, accepted=4, committed=5)  # all 4 levels used: alpha = 1 (positive); commits idx 2..6
    s2 = pol.shape(7)  # cell (1, 2): left cell (1, 1) = index 6 has the positive record
    assert (s2.depth, s2.top_k) == (5, 4)
    pol.observe(7, s2, accepted=1, committed=2)  # alpha = 0.2: negative; commits indices 7, 8
    s3 = pol.shape(9)  # cell (2, 0): row start -> falls back to the cell above, (1, 0) = index 5 (positive)
    assert (s3.depth, s3.top_k) == (5, 4)
    s4 = pol.shape(8 + 1 - 1 + 1)  # index 9 again, consistent
    assert s4 == s3
    pol_v = AdtPolicy(AdtOptions(init="vertical", d0=4, k0=10, l_k=10, k_min=3, k_max=40), 4)
    pol_v.reset()
    pol_v.observe(2, s1, accepted=1, committed=1)  # index 2 = cell (0, 1): negative record
    assert (pol_v.shape(6).depth, pol_v.shape(6).top_k) == (3, 20)  # index 6 = cell (1, 1): above is (0, 1)
