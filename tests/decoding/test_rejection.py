"""Lossless sampling: tree rejection sampling of deterministic drafts reproduces the target distribution (statistical
tests), and its batched walk is the textbook one."""

from __future__ import annotations

import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from specgen.decoding import accept
from specgen.decoding.accept import accept_sampled
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import SamplingParams, inverse_cdf, logits_to_probs
from specgen.decoding.tree import DraftTree
from specgen.models import graphs
from tests.conftest import tiny_model
from tests.models.test_graphs import traced

V = 6


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def empirical(samples: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(samples), minlength=V).float() / len(samples)


T1 = SamplingParams(temperature=1.0)
WALKS = pytest.mark.parametrize("host_walk", [accept.HOST_WALK, frozenset()], ids=["row-walk", "batched-walk"])


def draws(draft: Draft, probs: torch.Tensor, n: int, seed: int) -> list[Verdict]:
    """n independent verdicts of one draft over probs [S, V] (as logits at temperature 1): n rows of one call, one
    stream."""
    g = torch.Generator().manual_seed(seed)
    return accept_sampled([draft] * n, probs.log().expand(n, *probs.shape), T1, [g] * n)


# the TV bound scales as 1/sqrt(n) (about 2.6x the expected sampling TV at both sizes): the default run keeps the
# smaller sample, `slow` the larger one
SIZES = pytest.mark.parametrize("n,bound", [(5000, 0.03), pytest.param(20000, 0.015, marks=pytest.mark.slow)])
P = torch.tensor([0.3, 0.05, 0.2, 0.15, 0.1, 0.2])


@WALKS
@SIZES
def test_deterministic_topk_siblings_match_target_and_trying_them_against_p_would_not(n, bound, host_walk,
                                                                                      monkeypatch):
    """Three top-k siblings (q = 1): the first token is p's draw. The control, each sibling tried against p rather
    than the residual (the classic bug), would put 0.7 x 0.8 x 0.2 = 0.112 on the third where p has 0.2."""
    monkeypatch.setattr(accept, "HOST_WALK", host_walk)
    draft = Draft((0, 2, 5), DraftTree((-1, -1, -1)))
    probs = torch.stack([P] + [torch.full((V,), 1.0 / V)] * 3)
    emp = empirical([v.tokens[0] for v in draws(draft, probs, n, 1)])
    assert tv(emp, P) < bound
    # the control's law: 0, 2, 5 accepted with P's 0.3, 0.2, 0.2 in turn, else a draw from P less the three
    wrong = torch.zeros(V)
    wrong[[0, 2, 5]] = torch.tensor([0.3, 0.7 * 0.2, 0.7 * 0.8 * 0.2])
    wrong[[1, 3, 4]] = 0.7 * 0.8 * 0.8 * P[[1, 3, 4]] / 0.3
    assert abs(float(wrong.sum()) - 1) < 1e-6 and tv(wrong, P) > 4 * bound  # the test tells the bug from the rule


@WALKS
@SIZES
def test_a_second_level_follows_its_parents_distribution(n, bound, host_walk, monkeypatch):
    """Root children 1, 3 and node 1's children 0, 4: the first token is p_root's draw; after token 1 the second is
    node 1's distribution's (its children tried on their residual, else its residual's draw)."""
    monkeypatch.setattr(accept, "HOST_WALK", host_walk)
    p_root = torch.tensor([0.1, 0.3, 0.2, 0.1, 0.2, 0.1])
    p_one = torch.tensor([0.4, 0.1, 0.1, 0.1, 0.2, 0.1])
    draft = Draft((1, 3, 0, 4), DraftTree((-1, -1, 0, 0)))
    probs = torch.stack([p_root, p_one, torch.full((V,), 1.0 / V), torch.full((V,), 1.0 / V), torch.full((V,), 0.5)])
    verdicts = draws(draft, probs, n, 2)
    assert tv(empirical([v.tokens[0] for v in verdicts]), p_root) < bound
    seconds = [v.tokens[1] for v in verdicts if v.tokens[0] == 1]
    assert tv(empirical(seconds), p_one) < 2 * bound  # ~0.3 n of them


def reference(draft: Draft, probs: torch.Tensor, u: list[float]) -> Verdict:
    """The textbook walk, one node at a time: node c tried with its uniform u[c] against the renormalised residual
    of its parent's row, the last token from u[draft.size]."""
    node, path = -1, []
    while True:
        p = probs[node + 1].clone()
        nxt = None
        for c in draft.tree.children[node + 1]:
            x = draft.tokens[c]
            if p[x] > 0 and u[c] < float(p[x] / p.sum()):
                nxt = c
                break
            p[x] = 0.0
        if nxt is None:
            p = p if p.sum() > 0 else probs[node + 1]
            last = int(inverse_cdf(p[None], torch.tensor([[u[draft.size]]]))[0])
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (last,))
        path.append(nxt)
        node = nxt


def random_draft(rng: random.Random, most: int) -> Draft:
    n = rng.randrange(most + 1)
    parents = tuple(rng.randrange(-1, i) for i in range(n))
    kids: dict[int, set[int]] = {}
    tokens = []
    for p in parents:  # siblings carry distinct tokens (a prefix tree's); cousins may share one
        tokens.append(rng.choice([t for t in range(V) if t not in kids.setdefault(p, set())]))
        kids[p].add(tokens[-1])
    return Draft(tuple(tokens), DraftTree(parents))


@pytest.mark.parametrize("seed", range(3))
def test_both_walks_are_the_textbook_walk_on_the_same_uniforms(seed, monkeypatch):
    """Random trees (chains, bushes, empty drafts; filtered rows with zeros; a batch of mixed sizes, padded): the
    row walk's (a CPU's) and the batched walk's (a GPU's) verdicts equal the textbook walk's, each row with the
    uniforms its generator drew."""
    rng = random.Random(seed)
    drafts = [random_draft(rng, 7) for _ in range(40)]
    width = max(d.size for d in drafts)
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(40, width + 1, V, generator=g) ** 3
    probs = torch.where((probs > 0.05) | (probs == probs.amax(-1, keepdim=True)), probs, 0.0)
    for i, d in enumerate(drafts):  # the first child of a node likely, so that paths go deep
        for kids in d.tree.children:
            if kids and probs[i, d.tree.parents[kids[0]] + 1, d.tokens[kids[0]]] > 0:
                probs[i, d.tree.parents[kids[0]] + 1, d.tokens[kids[0]]] += 0.5
    logits = probs.log()  # [40, S, V]: a few ids filtered out a row

    def gens() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + i) for i in range(40)]

    filtered = logits_to_probs(logits, T1)
    want = [reference(d, filtered[i], torch.rand(d.size + 1, generator=g).tolist()) for i, (d, g)
            in enumerate(zip(drafts, gens()))]
    assert sum(v.num_accepted for v in want) > 10 and any(0 < v.num_accepted < d.size for v, d in zip(want, drafts))
    assert accept_sampled(drafts, logits, T1, gens()) == want  # the row walk
    monkeypatch.setattr(accept, "HOST_WALK", frozenset())
    assert accept_sampled(drafts, logits, T1, gens()) == want  # the batched walk
    alone = [accept_sampled([d], logits[i : i + 1, : d.size + 1], T1, [g])[0] for i, (d, g)
             in enumerate(zip(drafts, gens()))]
    assert alone == want  # a row's verdict does not depend on its batch or its padding
    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    captures = graphs.attach(tiny_model(0), "on", capture=True)  # the batched walk replayed in a bucket (a GPU's)
    assert accept_sampled(drafts, logits, T1, gens(), captures) == want
    alone = [accept_sampled([d], logits[i : i + 1, : d.size + 1], T1, [g], captures)[0] for i, (d, g)
             in enumerate(zip(drafts, gens()))]  # replays over what earlier calls left in the buckets' padding
    assert alone == want
    assert sum(captures.uses.values()) > captures.recorded  # replays, not captures alone


@pytest.mark.parametrize("params", [SamplingParams(1.0, top_k=3, top_p=0.9), SamplingParams(0.7, top_p=0.8)],
                         ids=["top-k", "top-p"])
def test_the_captured_walk_reads_nothing_on_the_host_and_keeps_its_bucket_shape(params):
    """`walked`, what a bucket's capture holds, run over fake tensors: a host read (a GPU sync, which a capture
    refuses) raises there. Its top-k takes the tie path on every row rather than asking the host which rows tie."""
    rows, width, vocab = 4, 8, 64
    with FakeTensorMode() as mode:
        logits, x = torch.randn(rows, width + 1, vocab), torch.zeros(rows, 3, width + 1)
        out, = accept.walked(logits, x, params, rounds=3)
    assert out.shape == (rows, width + 1) and mode is not None


def test_a_filter_that_asks_the_host_which_rows_tie_fails_the_check():
    """The control: the same harness refuses top-k's host path (`bool(tied.any())`)."""
    with FakeTensorMode(), pytest.raises(Exception, match="[Dd]ata.dependent|item|local_scalar"):
        logits_to_probs(torch.randn(4, 64), SamplingParams(1.0, top_k=3), host_reads=True)


def test_top_ks_tie_path_on_every_row_gives_each_rows_probabilities():
    """Without host reads every row takes both paths and keeps its own: the same probabilities as the host's choice
    (a tied bfloat16 row and untied rows)."""
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.9)
    tied = torch.tensor([3.0, 2, 1, 1, 1, 1, 0] + [-5.0] * 57, dtype=torch.bfloat16)
    rows = torch.stack([tied, *torch.randn(6, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)])
    torch.testing.assert_close(logits_to_probs(rows, params, host_reads=False), logits_to_probs(rows, params))


@WALKS
def test_a_filtered_token_is_never_accepted_and_a_certain_one_always(host_walk, monkeypatch):
    monkeypatch.setattr(accept, "HOST_WALK", host_walk)
    draft = Draft((2, 4), DraftTree((-1, -1)))
    probs = torch.zeros(3, V)
    probs[:, 4] = 1.0  # every row: all mass on 4 (node 1's token), none on 2 (node 0's)
    verdicts = draws(draft, probs, 200, 3)
    assert {v.path for v in verdicts} == {(1,)}
    assert {v.tokens for v in verdicts} == {(4, 4)}  # node 1's row: all mass on 4


def test_the_batched_walk_reads_the_host_once(monkeypatch):
    monkeypatch.setattr(accept, "HOST_WALK", frozenset())
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    for name in ("item", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, lambda *a, n=name: pytest.fail(f"a host read: {n}"))
    accept_sampled([Draft((1, 2), DraftTree((-1, 0)))] * 3, torch.zeros(3, 3, V), T1, [None] * 3)
    assert reads[3:] == [(3, 3)]  # after the three rows' uniforms (drawn on the host), the verdicts' one read


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
