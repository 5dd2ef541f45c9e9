"""Lossless XSpecMesh (criterion "rejection"): the backbone's sampling distribution, greedy AR, option errors."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest
import torch

from specgen.decoding.draft import Draft
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.decoding.tree import DraftTree
from specgen.errors import UsageError
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from specgen.methods.xspecmesh_pool import Proposal
from specgen.models.mesh import MeshGPT
from tests.mesh.mesh_fixtures import tiny_heads, tiny_kwargs
from tests.mesh.test_mesh_xspecmesh import one_thread, setup  # noqa: F401  (fixtures: the tiny model, 1 thread)

#: A 3-token support per position (top-k 3) at a high temperature, so the joint of the first 3 tokens has 27 cells
#: of comparable mass and the second-choice candidates below are accepted often but not always.
TOP3 = SamplingParams(3.0, 3, 1.0)
LOSSLESS = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)


class ExactBackbone:
    """The backbone's filtered next-token distribution after any prefix, by a teacher-forced pass (memoised)."""

    def __init__(self, model, pc: torch.Tensor, params: SamplingParams) -> None:
        self.model, self.pc, self.params, self.memo = model, pc, params, {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.memo:
            with torch.no_grad():
                logits, _, _ = self.model.forward_train(self.pc.unsqueeze(0), torch.tensor([[*prefix, 0]]))
            self.memo[prefix] = logits_to_probs(logits[0, -1], self.params)  # [V]
        return self.memo[prefix]

    def joint(self, n: int) -> dict[tuple[int, ...], float]:
        """P(x_1 .. x_n) over the filtered supports."""
        out: dict[tuple[int, ...], float] = {(): 1.0}
        for _ in range(n):
            out = {pre + (t,): w * float(self(pre)[t]) for pre, w in out.items()
                   for t in self(pre).nonzero().flatten().tolist()}
        return out


class SecondChoice(MeshDecoder):
    """Deterministic candidates inside the backbone's support: each is its SECOND most likely token after the
    prefix and the candidates before it, so the exact rule accepts it sometimes and rejects it sometimes. Its
    "proposer probability" is (id mod 5 + 1) / 5, a function of the history like a head's, so `min_path_prob` 0.15
    cuts some chains and not others (the backbone's own probabilities are all ~1/3 at this temperature)."""

    exact: ExactBackbone

    def _candidates(self, out, x, heads, d, opts, memory=None):
        chain, probs = (*out, x), []
        for _ in range(d):
            chain += (int(self.exact(chain).topk(2).indices[1]),)
            probs.append((chain[-1] % 5 + 1) / 5)
        return Proposal(list(chain[len(out) + 1 :]), probs)


class SecondAndThird(SecondChoice):
    """A candidate tree inside the backbone's support: the root's children its second and third most likely tokens,
    each with one child, the second most likely after it; the exact rule tries the siblings in turn."""

    def _tree(self, out, x, heads, widths, memory=None):
        tokens, parents = [], []
        for first in self.exact((*out, x)).topk(3).indices[1:].tolist()[: widths[0]]:
            tokens.append(first)
            parents.append(-1)
            if len(widths) > 1:
                tokens.append(int(self.exact((*out, x, first)).topk(2).indices[1]))
                parents.append(len(tokens) - 2)
        return Draft(tuple(tokens), DraftTree(tuple(parents)))


def tv_to_backbone(setup, opts: XSpecMeshOptions, n: int = 2500, decoder=SecondChoice) -> tuple[float, float, Counter]:
    """(total variation between the first 3 decoded tokens and the backbone's joint, mean tokens per step,
    how many first steps verified 0, 1, 2 (or, a tree, 4) candidates)."""
    model, pc = setup
    dec = decoder(model, tiny_heads(num_heads=2))
    dec.exact = ExactBackbone(model, pc, TOP3)
    want = dec.exact.joint(3)
    g, counts, taus, drafted = torch.Generator().manual_seed(0), Counter(), [], Counter()
    for _ in range(n):
        res = dec.generate_batch([pc], TOP3, 4, opts, [g])[0]  # a budget of 4: the first step may verify 2 candidates
        counts[tuple(res.tokens[:3])] += 1
        taus.append(res.stats.tau)
        drafted[res.stats.draft_sizes[0]] += 1
    assert set(counts) <= set(want)  # every decoded triple is in the backbone's support
    tv = 0.5 * sum(abs(counts[k] / n - w) for k, w in want.items())
    return tv, sum(taus) / n, drafted


@pytest.mark.slow
def test_rejection_keeps_the_backbone_distribution_and_the_paper_rule_does_not(setup):
    """27 cells, 2,500 decodes: sampling noise alone gives TV ~ 0.03. The lossy p > delta rule on the same
    candidates is far off (the test can fail), the rejection rule is not, and it still accepts candidates."""
    lossless_tv, lossless_tau, _ = tv_to_backbone(setup, LOSSLESS)
    lossy_tv, _, _ = tv_to_backbone(setup, XSpecMeshOptions(delta=0.2, sampling="tree", top_k_tree=1))
    assert lossless_tv < 0.06
    assert lossy_tv > 0.15
    assert lossless_tau > 1.2


@pytest.mark.slow
def test_a_path_cut_keeps_rejection_lossless(setup):
    """min_path_prob (beyond the paper) shortens some chains (the candidates' running probability falls below it)
    and leaves others whole; the output is still the backbone's joint (TV as above)."""
    tv, tau, sizes = tv_to_backbone(setup, dataclasses.replace(LOSSLESS, min_path_prob=0.15))
    assert tv < 0.06 and tau > 1.1
    assert sizes[1] > 0.1 * sum(sizes.values()) and sizes[2] > 0.1 * sum(sizes.values())  # some cut, some whole


@pytest.mark.slow
def test_a_candidate_tree_keeps_rejection_lossless(setup):
    """A candidate tree (beyond the paper) of two siblings, each with a child: the rule tries the second sibling
    after rejecting the first, on the residual; the output is still the backbone's joint (TV as above), and the
    first steps verify the whole tree."""
    tv, tau, sizes = tv_to_backbone(setup, dataclasses.replace(LOSSLESS, candidate_tree="2,1"), decoder=SecondAndThird)
    assert tv < 0.06 and tau > 1.2
    assert sizes[4] > 0.5 * sum(sizes.values())


def test_rejection_at_temperature_zero_is_greedy_ar(setup):
    model, pc = setup
    greedy = SamplingParams(0.0)
    ar = MeshDecoder(model).generate_batch([pc], greedy, 80)[0].tokens
    vertex = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1, vertex_lookup=True)
    for opts in (LOSSLESS, vertex, dataclasses.replace(LOSSLESS, candidate_tree="3,2,1"),
                 dataclasses.replace(vertex, candidate_tree="4,2")):
        res = MeshDecoder(model, tiny_heads()).generate_batch([pc], greedy, 80, opts,
                                                              [torch.Generator().manual_seed(1)])[0]
        assert res.tokens == ar


def test_a_candidate_tree_runs_to_the_budget_at_the_context_limit(setup):
    """The most tokens the budget check allows (context less the heads' look-ahead and 2) leave less than a tree's
    nodes of the context: the tree's nodes take cache slots past it (positions stay inside), so it decodes as AR."""
    torch.manual_seed(0)
    model, pc, n = MeshGPT(**tiny_kwargs(max_seq_len=48)).eval(), setup[1], 48 - 3 - 2
    greedy = SamplingParams(0.0)
    ar = MeshDecoder(model).generate_batch([pc, pc], greedy, n)
    assert [len(r.tokens) for r in ar] == [n, n]  # no EOS: both run to the budget
    opts = dataclasses.replace(LOSSLESS, candidate_tree="3,2,2")  # 21 nodes
    for batch_size in (1, 2):
        res = MeshDecoder(model, tiny_heads()).generate_batch([pc, pc], greedy, n, opts, batch_size=batch_size)
        assert [r.tokens for r in res] == [r.tokens for r in ar]


def test_rejection_labels_and_option_errors():
    assert LOSSLESS.lossless and not XSpecMeshOptions().lossless
    assert LOSSLESS.label().startswith("rejection sampling")
    for bad in (dict(), dict(sampling="tree", top_k_tree=2)):  # sampled candidates have no one-hot q
        with pytest.raises(UsageError, match="deterministic candidates"):
            XSpecMeshOptions(criterion="rejection", **bad)
    with pytest.raises(UsageError, match="threshold, topk, rejection"):
        XSpecMeshOptions(criterion="nope")
    for bad in (-0.1, 1.0):
        with pytest.raises(UsageError, match="min_path_prob"):
            XSpecMeshOptions(min_path_prob=bad)
    assert XSpecMeshOptions(min_path_prob=0.3).label().endswith("path cut 0.3")
    assert dataclasses.replace(LOSSLESS, candidate_tree="4,2").tree_widths == (4, 2)
    for bad in ("4,0", "a", "4,,2"):
        with pytest.raises(UsageError, match="candidate_tree must be comma-separated widths"):
            dataclasses.replace(LOSSLESS, candidate_tree=bad)
    for bad in (dict(), dict(criterion="rejection", sampling="tree", top_k_tree=1, min_path_prob=0.1)):
        with pytest.raises(UsageError, match="candidate_tree needs criterion=rejection"):
            XSpecMeshOptions(candidate_tree="2,1", **bad)


def test_a_candidate_tree_wider_than_the_heads_is_one_line(setup):
    model, pc = setup
    with pytest.raises(UsageError, match="one width a head, at most the 3 heads"):
        MeshDecoder(model, tiny_heads()).generate_batch([pc], SamplingParams(0.0), 8,
                                                        dataclasses.replace(LOSSLESS, candidate_tree="2,2,2,2"))


@pytest.mark.parametrize("k", [1, 2])
def test_exact_joint_is_normalised(setup, k):
    model, pc = setup
    joint = ExactBackbone(model, pc, TOP3).joint(k)
    assert len(joint) == 3**k and abs(sum(joint.values()) - 1.0) < 1e-5
    assert all(len(t) == k for t in itertools.islice(joint, 3))
