"""Lossless sampling: tree rejection sampling reproduces the target distribution (statistical tests)."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.accept import accept_rejection
from specgen.decoding.draft import Draft
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.decoding.tree import DraftTree

V = 6


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def empirical(samples: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(samples), minlength=V).float() / len(samples)


# the TV bound scales as 1/sqrt(n) (about 2.6x the expected sampling TV at both sizes): the default run keeps the
# smaller sample, `slow` the larger one
SIZES = pytest.mark.parametrize("n,bound", [(5000, 0.03), pytest.param(20000, 0.015, marks=pytest.mark.slow)])


@SIZES
def test_chain_with_true_q_matches_target(n, bound):
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
    q = torch.tensor([0.3, 0.1, 0.3, 0.1, 0.1, 0.1])
    firsts = []
    for _ in range(n):
        tok = int(torch.multinomial(q, 1, generator=g))
        draft = Draft((tok,), DraftTree((-1,)), q.unsqueeze(0))
        probs = torch.stack([p, torch.full((V,), 1.0 / V)])
        firsts.append(accept_rejection(draft, probs, g).tokens[0])
    emp = empirical(firsts)
    assert tv(emp, p) < bound
    assert tv(emp, q) > 0.2  # the test can fail: the draft distribution is far away


@SIZES
def test_deterministic_topk_siblings_match_target(n, bound):
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.3, 0.05, 0.2, 0.15, 0.1, 0.2])
    draft = Draft((0, 2, 5), DraftTree((-1, -1, -1)))  # three deterministic top-k siblings (q = 1)
    probs = torch.stack([p] + [torch.full((V,), 1.0 / V)] * 3)
    firsts = [accept_rejection(draft, probs, g).tokens[0] for _ in range(n)]
    assert tv(empirical(firsts), p) < bound


@SIZES
def test_iid_sampled_siblings_and_second_level_match_target(n, bound):
    g = torch.Generator().manual_seed(2)
    p_root = torch.tensor([0.1, 0.3, 0.2, 0.1, 0.2, 0.1])
    p_child = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    q = torch.tensor([0.2, 0.2, 0.1, 0.1, 0.2, 0.2])
    pairs = []
    for _ in range(n):
        a, b = (int(x) for x in torch.multinomial(q, 2, replacement=True, generator=g))
        c = int(torch.multinomial(q, 1, generator=g))
        draft = Draft((a, b, c), DraftTree((-1, -1, 0)), torch.stack([q, q, q]))
        # the second-level distribution depends on the first token only through the tree; use p_child for all
        probs = torch.stack([p_root, p_child, p_child, p_child])
        toks = accept_rejection(draft, probs, g).tokens
        pairs.append(toks[0])
    assert tv(empirical(pairs), p_root) < bound


def test_top_p_top_k_filtering():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_rows_filtered_probabilities_do_not_depend_on_the_rows_beside_it(top_p):
    """Top-k decides per row whether ties at the k-th value widen it: a neighbour with ties (bfloat16 logits tie
    often; a batch's other rows, a tree's padding) must not change a row's probabilities, bit for bit."""
    params = SamplingParams(temperature=1.0, top_k=5, top_p=top_p)
    tied = torch.tensor([3.0, 2, 1, 1, 1, 1, 0] + [-5.0] * 57, dtype=torch.bfloat16)  # its 5th value tied thrice
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(20, 64, generator=g).to(torch.bfloat16)  # no ties at their 5th value (checked)
    assert all(int((r >= r.topk(5).values[-1]).sum()) == 5 for r in rows)
    alone = torch.stack([logits_to_probs(r, params) for r in rows])  # [20, V]
    beside = logits_to_probs(torch.stack([tied, *rows]), params)  # [21, V]
    assert torch.equal(beside[1:], alone)
    assert torch.equal(beside[0], logits_to_probs(tied, params)) and int((beside[0] > 0).sum()) > 1
    assert torch.equal(logits_to_probs(torch.stack([tied, *rows]).view(3, 7, 64), params).view(21, 64), beside)
