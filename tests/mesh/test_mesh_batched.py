"""Meshes on the batched loop: each point cloud's mesh does not depend on which clouds share its batch (greedy and
sampled, lossy and lossless rules), lossless XSpecMesh equals AR, and AR is the loop's empty draft."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.generate.mesh import Condition, MeshGenConfig, generate_meshes
from specgen.methods.xspecmesh import LoadedMesh, MeshDecoder, XSpecMeshOptions
from specgen.request import parse_request
from tests.image_fixtures import one_thread
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

SAMPLED = SamplingParams(1.0, 50, 0.95)
LOSSLESS = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)


_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


@pytest.fixture(scope="module")
def clouds():
    return procedural_clouds(range(11, 17))


def streams(indices):
    """Cloud i's two random streams (backbone samples, head candidates), whatever batch it is in."""
    return ([torch.Generator().manual_seed(3 + i) for i in indices],
            [torch.Generator().manual_seed(100 + i) for i in indices])


def decode_all(decoder, clouds, params, opts, batch_size, indices=None):
    indices = list(range(len(clouds))) if indices is None else indices
    gens, dgens = streams(indices)
    return [r.tokens for r in decoder.generate_batch(clouds, params, 60, opts, gens, dgens, batch_size)]


# the default run keeps one case (sampled, lossless rule); the other five are `slow`
@pytest.mark.parametrize("opts,params", [
    pytest.param(o, p, id=f"{oid}-{pid}", marks=() if (oid, pid) == ("rejection", "sampled") else pytest.mark.slow)
    for oid, o in [("rejection", LOSSLESS), ("threshold", XSpecMeshOptions(delta=0.05)),
                   ("vertex-lookup", XSpecMeshOptions(vertex_lookup=True))]
    for pid, p in [("greedy", SamplingParams()), ("sampled", SAMPLED)]])
def test_each_mesh_is_independent_of_its_batch(clouds, params, opts):
    decoder = MeshDecoder(tiny_mesh_model(), tiny_heads())
    alone = [decode_all(decoder, [pc], params, opts, 1, [i])[0] for i, pc in enumerate(clouds)]
    for batch_size in (3, 8):
        assert decode_all(decoder, clouds, params, opts, batch_size) == alone, batch_size
    order = [4, 0, 5, 2, 1, 3]
    assert decode_all(decoder, [clouds[i] for i in order], params, opts, 3, order) == [alone[i] for i in order]


def test_lossless_xspecmesh_batched_is_greedy_ar(clouds):
    model = tiny_mesh_model()
    ar = decode_all(MeshDecoder(model, None), clouds, SamplingParams(), None, 1)
    xs = decode_all(MeshDecoder(model, tiny_heads()), clouds, SamplingParams(), LOSSLESS, 4)
    assert xs == ar and decode_all(MeshDecoder(model, None), clouds, SamplingParams(), None, 6) == ar
    # budget=auto: each step is AR or the heads' draft, whichever measured faster at its batch size
    auto = replace(LOSSLESS, budget="auto")
    assert decode_all(MeshDecoder(model, tiny_heads()), clouds, SamplingParams(), auto, 4) == ar


def test_a_sampled_auto_budget_run_repeats_with_its_seed_whatever_the_step_times(clouds, monkeypatch):
    """Sampled XSpecMesh under `budget=auto`: one run whose draft steps time 10x faster than AR's, one whose time 10x
    slower, draw the same meshes from the same seeds (a sampled row's draws follow whether its steps drafted, so a
    choice by wall time made them differ)."""
    from tests.budget_fixtures import step_times

    model, heads = tiny_mesh_model(), tiny_heads()

    def tokens(draft_seconds: float) -> list[list[int]]:
        step_times(monkeypatch, lambda cap: draft_seconds if cap else 1.0)
        return decode_all(MeshDecoder(model, heads), clouds, SAMPLED, replace(LOSSLESS, budget="auto"), 3)

    assert tokens(0.1) == tokens(10.0)


def test_a_greedy_auto_budget_predicts_a_new_batch_size_from_the_backbones_curve(monkeypatch):
    """Greedy meshes under `budget=auto` measure wall times and carry the backbone's cost curve too, so a batch size
    never seen is predicted from a measured one (MeasuredBudget 5.) instead of being measured from scratch."""
    from specgen.methods.xspecmesh import auto_budget

    budget = auto_budget(MeshDecoder(tiny_mesh_model(), tiny_heads()), 3, SamplingParams(), LOSSLESS)
    assert budget.timed and budget.cost is not None
    for _ in range(2 * budget.tries + 3):  # batch 1 measured both ways (a switch step unmeasured): the draft far behind
        cap = budget.cap(1)
        budget.observe(cap, cap, 0)
        budget.observe_step(1.0 if cap else 0.1)
    assert 1 in budget._ratio and budget.predict(8) is not None


def test_the_mesh_cost_curve_is_timed_cross_attending_to_a_condition_of_the_encoders_shape(monkeypatch):
    """The backbone's curve times the decoder as a mesh runs it: every block cross-attends to a condition of the
    encoder's [num_latents, out_dim] (without one the cross-attention went uncounted); what is timed keys the stored
    curve, so a decoder-only curve stored earlier is not read for it."""
    from specgen.decoding import cost
    from specgen.methods.xspecmesh import auto_budget
    from specgen.models.transformer import CrossAttention

    attended, forward = [], CrossAttention.forward
    monkeypatch.setattr(CrossAttention, "forward", lambda self, x, kv: attended.append(kv[0].shape[-2]) or
                        forward(self, x, kv))
    model = tiny_mesh_model()
    auto_budget(MeshDecoder(model, tiny_heads()), 3, SAMPLED, LOSSLESS)
    assert len(attended) >= model.dec_cfg.n_layers and set(attended) == {model.enc_cfg.num_latents}
    from specgen.methods.xspecmesh import ConditionedForward  # what it times

    assert cost.key(ConditionedForward(model)) != cost.key(cost.Tokens(model.decoder))


def test_a_sampled_auto_budget_costs_each_draft_step_with_its_heads_calls(clouds, monkeypatch):
    """The heads are XSpecMesh's drafter: under sampled `budget=auto` each step that ran them reports one call per
    drafting mesh, and its cost is the backbone's verify plus those calls at the heads' curve (in the backbone's
    unit); an AR step runs and costs no heads."""
    from specgen.decoding.budget import MeasuredBudget

    steps = []  # (heads calls, the step's cost, its verify's cost)
    untimed = MeasuredBudget.untimed
    monkeypatch.setattr(MeasuredBudget, "untimed", lambda self, verified, forwards: steps.append(
        (list(forwards), untimed(self, verified, forwards), self.cost(verified))) or steps[-1][1])
    decode_all(MeshDecoder(tiny_mesh_model(), tiny_heads()), clouds[:3], SAMPLED, replace(LOSSLESS, budget="auto"), 3)
    assert any(calls for calls, _, _ in steps) and any(not calls for calls, _, _ in steps)
    assert all((cost > verify) == bool(calls) and set(calls) <= {1} for calls, cost, verify in steps)


def test_auto_budget_is_a_checked_option_and_named_in_the_row_label():
    from specgen.errors import UsageError

    assert "budget auto" in XSpecMeshOptions(budget="auto").label()
    with pytest.raises(UsageError, match="budget must be fixed or auto"):
        XSpecMeshOptions(budget="sometimes")


def test_generate_hands_over_each_mesh_when_it_is_done(clouds):
    """`generate_meshes` gives each mesh to `on_mesh` (where `generate` writes its file) as soon as it is done, while
    other meshes of the batch still decode, and the samples are the batch's own outputs."""
    decoder = MeshDecoder(tiny_mesh_model(), tiny_heads())
    events, batch = [], decoder.generate_batch

    def logged(*args, on_tokens=None, **kw):  # the loop's per-row token stream, logged in order
        args = list(args)
        tokens = args.pop(8)
        return batch(*args, on_tokens=lambda i, new: (events.append(("tokens", i)), tokens(i, new)), **kw)

    decoder.generate_batch = logged
    loaded = LoadedMesh(decoder, SimpleNamespace(meta={}), None, None)
    conds = [Condition(f"c{i}", c.numpy()) for i, c in enumerate(clouds[:3])]
    cfg = MeshGenConfig(max_new_tokens=40, batch_size=2, method_options=dict(criterion="rejection", sampling="tree", top_k_tree=1),
                        seed=5)
    handed = {}

    def on_mesh(i, sample):
        events.append(("mesh", i))
        handed[i] = list(sample.tokens)

    samples = generate_meshes(loaded, conds, parse_request(cfg, "mesh"), on_mesh=on_mesh)
    first = events.index(next(e for e in events if e[0] == "mesh"))
    assert any(kind == "tokens" and i != events[first][1] for kind, i in events[first:])  # others still decoding
    assert sorted(handed) == [0, 1, 2] and all(handed[i] == s.tokens for i, s in enumerate(samples))
    gens, dgens = ([torch.Generator().manual_seed(s + 5 + i) for i in range(3)] for s in (0, 10_000_019))
    direct = batch([torch.from_numpy(c.points) for c in conds], SamplingParams(0.5, 50, 0.95), 40, LOSSLESS, gens,
                   dgens, 2)
    assert [s.tokens for s in samples] == [r.tokens for r in direct] and samples[0].stats["scr"] > 0
