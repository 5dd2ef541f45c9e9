"""XSpecMesh decoding (Algorithm 1) on tiny random models: AR equivalences, rules, samplers, budgets."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from specgen.decoding.accept_threshold import AcceptCriterion, accept_lossy, accepted_length
from specgen.decoding.draft import Draft
from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.mesh.pointcloud import point_cloud
from specgen.mesh.procedural import generate_mesh
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from specgen.methods.xspecmesh_pool import Proposal, greedy_columns, greedy_draft, head_candidates, tree_sample
from tests.mesh.mesh_fixtures import NUM_POINTS, tiny_heads, tiny_mesh_model

SAMPLED = SamplingParams(1.0, 50, 0.95)


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def setup():
    g = generate_mesh(11)
    pc = torch.from_numpy(point_cloud(g.vertices, g.faces, NUM_POINTS, 0))
    return tiny_mesh_model(), pc


def run(model, heads, pc, params, opts=None, n=120, seed=3):
    gens = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    return MeshDecoder(model, heads).generate_batch([pc], params, n, opts, *zip(gens))[0]


@pytest.fixture(scope="module")
def ar_of(setup):
    """AR's decode of the setup's point cloud per (sampling, length), the reference of every rule below: decoded once
    (it is seeded, so another run gives the same result)."""
    model, pc = setup
    return functools.cache(lambda params, n=120: run(model, None, pc, params, n=n))


@pytest.mark.parametrize("sampling", ["independent", "tree"])
@pytest.mark.parametrize("kind", ["ca", "mlp", "ca+token", "ca+history"])
def test_delta_accepting_nothing_equals_ar_sampling(setup, ar_of, kind, sampling):
    model, pc = setup
    ar = ar_of(SAMPLED)
    heads = tiny_heads(kind.split("+")[0], token_input=kind.endswith("+token"), history=4 * kind.endswith("+history"))
    xs = run(model, heads, pc, SAMPLED, XSpecMeshOptions(delta=1.0, sampling=sampling))
    assert xs.tokens == ar.tokens and len(ar.tokens) == 120
    assert xs.stats.tau == 1.0 and xs.stats.steps == ar.stats.steps


def test_history_heads_read_the_committed_hidden_states(setup, monkeypatch):
    """The loop's window for history heads holds the committed tokens' hidden states, newest first: at each call
    the heads get h = teacher-forced row i and the projected rows i, i-1, i-2 (W = 3; some tokens accepted)."""
    from specgen.models.heads import StackedHeads

    model, pc = setup
    seen, features = [], StackedHeads.features
    monkeypatch.setattr(StackedHeads, "features", lambda self, h, kv, emb=None, past=None:
                        seen.append((self, h.clone(), past.clone())) or features(self, h, kv, emb, past))
    res = run(model, tiny_heads(scramble=False, history=3), pc, SAMPLED, XSpecMeshOptions(criterion="topk", top_k_accept=50),
              n=40)
    assert res.stats.tau > 1.5 and len(seen) == res.stats.steps  # before every verify step (none after the last)
    with torch.no_grad():
        _, hidden, _ = model.forward_train(pc.unsqueeze(0), torch.tensor([res.tokens]))  # row i: after i tokens
    rows = hidden[0]
    for stacked, h, past in seen:
        i = int((rows - h[0]).abs().amax(-1).argmin())
        torch.testing.assert_close(h[0], rows[i], atol=1e-4, rtol=1e-4)
        expect = stacked.project_history(rows[max(0, i - 2) : i + 1].flip(0))
        torch.testing.assert_close(past, expect, atol=1e-4, rtol=1e-4)
    assert seen[0][2].shape[1] == 1 and max(p.shape[1] for _, _, p in seen) == 3


@pytest.mark.parametrize("history", [pytest.param(0, marks=pytest.mark.slow), 3])
def test_bfloat16_drafting_changes_candidates_not_the_rule(setup, ar_of, history):
    """bf16 head logits propose (nearly) the same tokens; acceptance stays float32, so accept-nothing is still AR
    sampling and greedy is still greedy AR."""
    model, pc = setup
    bf16 = dict(draft_dtype="bfloat16")
    heads = tiny_heads(history=history)
    ar, greedy_ar = ar_of(SAMPLED), ar_of(SamplingParams(0.0))
    assert run(model, heads, pc, SAMPLED, XSpecMeshOptions(delta=1.0, **bf16)).tokens == ar.tokens
    assert run(model, heads, pc, SamplingParams(0.0), XSpecMeshOptions(delta=0.5, **bf16)).tokens == greedy_ar.tokens
    loose = XSpecMeshOptions(criterion="topk", top_k_accept=50)
    a = run(model, tiny_heads(scramble=False, history=history), pc, SAMPLED, loose)
    b = run(model, tiny_heads(scramble=False, history=history), pc, SAMPLED, dataclasses.replace(loose, **bf16))
    assert b.stats.tau > 1.5 and abs(b.stats.tau - a.stats.tau) < 0.5
    with pytest.raises(UsageError, match="draft_dtype"):
        XSpecMeshOptions(draft_dtype="int4")


def test_greedy_threshold_is_greedy_ar(setup, ar_of):
    model, pc = setup
    greedy = SamplingParams(0.0)
    ar = ar_of(greedy)
    for opts in (XSpecMeshOptions(delta=0.5), XSpecMeshOptions(criterion="topk", top_k_accept=1),
                 XSpecMeshOptions(delta=0.1, sampling="tree", top_k_tree=3)):
        assert run(model, tiny_heads(), pc, greedy, opts).tokens == ar.tokens


class _PerfectCandidates(MeshDecoder):
    """Candidates = the next D tokens of a known sequence (scripts/mesh_oracle_speed.py's premise)."""

    reference: list[int] = []

    def _candidates(self, out, x, heads, d, opts, memory=None):
        tokens = self.reference[len(out) + 1 : len(out) + 1 + d]
        return Proposal(tokens, [1.0] * len(tokens))


@pytest.mark.parametrize("d", [1, 2, 4])
def test_perfect_candidates_accept_all_d_and_stay_greedy_ar(setup, ar_of, d):
    model, pc = setup
    greedy = SamplingParams(0.0)
    ar = ar_of(greedy, 60)
    oracle = _PerfectCandidates(model, tiny_heads(num_heads=d))
    oracle.reference = ar.tokens
    res = oracle.generate_batch([pc], greedy, 60, XSpecMeshOptions(num_heads=d))[0]
    assert res.tokens == ar.tokens
    assert res.stats.accepted[:-1] == [d] * (res.stats.steps - 1)  # every step but the last takes all D


def test_loose_rules_accept_more(setup):
    model, pc = setup
    strict = run(model, tiny_heads(scramble=False), pc, SAMPLED, XSpecMeshOptions(delta=0.9))
    loose = run(model, tiny_heads(scramble=False), pc, SAMPLED, XSpecMeshOptions(criterion="topk", top_k_accept=50))
    assert loose.stats.tau > strict.stats.tau >= 1.0
    assert loose.stats.steps < strict.stats.steps
    assert loose.stats.new_tokens == len(loose.tokens) <= 120


def test_budget_and_eos(setup):
    model, pc = setup
    res = run(model, tiny_heads(), pc, SAMPLED, XSpecMeshOptions(criterion="topk", top_k_accept=50), n=7)
    assert len(res.tokens) == 7
    head = model.decoder.output

    class EOSBoost(torch.nn.Module):  # make EOS overwhelmingly likely for backbone and heads
        def forward(self, x):
            y = head(x)
            y[..., 5120] += 100.0
            return y

    model.decoder.output = EOSBoost()
    try:
        res = run(model, tiny_heads(), pc, SAMPLED, XSpecMeshOptions())
    finally:
        model.decoder.output = head
    assert res.tokens == [5120]


def test_too_many_heads_is_usage_error(setup):
    model, pc = setup
    with pytest.raises(UsageError):
        run(model, tiny_heads(num_heads=2), pc, SAMPLED, XSpecMeshOptions(num_heads=3))
    with pytest.raises(UsageError):
        XSpecMeshOptions(criterion="nope")
    with pytest.raises(UsageError):
        XSpecMeshOptions(sampling="beam")


def test_threshold_rules_are_pure_and_strict():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]])
    assert accepted_length((0, 0, 2), probs, AcceptCriterion("threshold", 0.5)) == 1  # 0.5 is not > 0.5
    assert accepted_length((0, 1, 2), probs, AcceptCriterion("threshold", 0.4)) == 3
    assert accepted_length((1, 1, 0), probs, AcceptCriterion("topk", top_k=2)) == 3  # ties share a rank
    assert accepted_length((2,), probs, AcceptCriterion("topk", top_k=2)) == 0
    assert accepted_length((0, 2), probs, AcceptCriterion("topk", top_k=3)) == 1  # filtered token never accepted
    v = accept_lossy(Draft.chain((0, 0, 2)), probs, AcceptCriterion("threshold", 0.55), None, greedy=True)
    assert v.path == (0,) and v.tokens == (0, 0)
    with pytest.raises(UsageError):
        XSpecMeshOptions(criterion="topk", top_k_accept=0)


def test_tree_sampling_prunes_and_follows_weights():
    probs = torch.zeros(3, 6)
    probs[:, 0], probs[:, 1], probs[:, 2] = 0.7, 0.29, 0.01
    g = torch.Generator().manual_seed(0)
    paths = [tuple(tree_sample(probs, 2, g)) for _ in range(400)]
    assert all(len(p) == 3 and set(p) <= {0, 1} for p in paths)  # top-2 only
    assert paths.count((0, 0, 0)) > paths.count((1, 1, 1))
    tiny = torch.full((4, 6), 1 / 6)
    tiny[:, 0] = 0.001
    assert len(tree_sample(torch.softmax(torch.randn(4, 6), -1) * 1e-3, 2, g)) == 4  # all pruned -> top-1 path


def test_a_one_branch_tree_proposes_the_heads_argmaxes():
    """K_s = 1 takes the argmax shortcut (`greedy_draft`: the heads' `greedy_columns`); it equals the tree sampler's
    one path under the run's filters."""
    from specgen.decoding.sampling import SamplingParams, logits_to_probs

    g = torch.Generator().manual_seed(3)
    params, opts = SamplingParams(0.5, 50, 0.95), XSpecMeshOptions(sampling="tree", top_k_tree=1)
    assert greedy_draft(params, opts)
    for _ in range(20):
        logits = torch.randn(4, 300, generator=g) * 3
        fast = Proposal.of_columns(greedy_columns(logits, 0.5, False).tolist(), 4).tokens
        assert fast == tree_sample(logits_to_probs(logits, params), 1, torch.Generator().manual_seed(0))


def test_lookup_candidates_change_the_draft_not_the_rule(setup, ar_of, monkeypatch):
    """n-gram lookup (beyond the paper) only changes which candidates are verified: accept-nothing is still AR
    sampling, greedy is still greedy AR; where the mesh so far repeats, lookup tokens are accepted and the heads
    are skipped when lookup fills all D slots."""
    from specgen.models.heads import StackedHeads

    model, pc = setup
    ar, greedy_ar = ar_of(SAMPLED), ar_of(SamplingParams(0.0))
    assert run(model, tiny_heads(), pc, SAMPLED, XSpecMeshOptions(delta=1.0, lookup=2)).tokens == ar.tokens
    greedy = [run(model, tiny_heads(), pc, SamplingParams(0.0), XSpecMeshOptions(lookup=k)) for k in (0, 1, 3)]
    assert all(r.tokens == greedy_ar.tokens for r in greedy)
    assert greedy[1].stats.tau > greedy[0].stats.tau  # the tiny model loops: its own history predicts it
    calls, features = [], StackedHeads.features
    monkeypatch.setattr(StackedHeads, "features", lambda self, *a, **k: calls.append(1) or features(self, *a, **k))
    res = run(model, tiny_heads(), pc, SamplingParams(0.0), XSpecMeshOptions(lookup=1))
    assert res.tokens == greedy_ar.tokens and len(calls) < res.stats.steps
    with pytest.raises(UsageError, match="lookup"):
        XSpecMeshOptions(lookup=-1)


def test_proposal_cut_stops_where_the_running_probability_drops():
    p = Proposal([7, 8, 9, 10], [0.9, 1.0, 0.5, 0.9])  # running: 0.9, 0.9, 0.45, 0.405
    assert p.cut(0.0) == [7, 8, 9, 10] and p.cut(0.41) == [7, 8, 9] and p.cut(0.5) == [7, 8] and p.cut(0.95) == []


def test_head_probabilities_are_the_tempered_softmax_of_their_tokens():
    logits, params = torch.randn(4, 300, generator=torch.Generator().manual_seed(5)) * 3, SamplingParams(0.5, 50, 0.95)
    for opts in (XSpecMeshOptions(sampling="tree", top_k_tree=1, min_path_prob=0.1), XSpecMeshOptions(min_path_prob=0.1)):
        prop = head_candidates(logits, params, opts, torch.Generator().manual_seed(0))
        want = (logits / 0.5).softmax(-1)[torch.arange(4), torch.tensor(prop.tokens)]
        torch.testing.assert_close(torch.tensor(prop.probs), want)
    cols = Proposal.of_columns(greedy_columns(logits, 0.5, True).tolist(), 4)  # a greedy draft's, with the heads
    torch.testing.assert_close(torch.tensor(cols.probs), (logits / 0.5).softmax(-1).max(-1).values)
    assert head_candidates(logits, params, XSpecMeshOptions(), None).probs == [1.0] * 4  # no cut: not computed


@pytest.mark.parametrize("extra", [pytest.param({}, marks=pytest.mark.slow),
                                   {"vertex_lookup": True, "sampling": "tree", "top_k_tree": 1}])
def test_a_path_cut_changes_the_draft_not_the_rule(setup, ar_of, extra):
    """min_path_prob (beyond the paper) only shortens what is verified: accept-nothing is still AR sampling,
    greedy still greedy AR, and a high cut verifies fewer candidates per step."""
    model, pc = setup
    ar, greedy_ar = ar_of(SAMPLED), ar_of(SamplingParams(0.0))
    cut = XSpecMeshOptions(min_path_prob=0.3, **extra)
    assert run(model, tiny_heads(), pc, SAMPLED, dataclasses.replace(cut, delta=1.0)).tokens == ar.tokens
    assert run(model, tiny_heads(), pc, SamplingParams(0.0), cut).tokens == greedy_ar.tokens
    whole = run(model, tiny_heads(scramble=False), pc, SAMPLED, XSpecMeshOptions(**extra))
    short = run(model, tiny_heads(scramble=False), pc, SAMPLED, cut)
    assert short.stats.d_bar < whole.stats.d_bar
