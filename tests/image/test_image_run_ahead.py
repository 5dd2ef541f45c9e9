"""EAGLE-2's and ADT-Tree's `run_ahead`: several tree steps a host read, each step's verdict and next pairs made on
the device, over the drafter's and target's static (or traced: as captured) steps."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.target import CFGTarget
from specgen.methods import get_method, run_batch
from specgen.methods.eagle_ahead import TreeAhead
from specgen.methods.text import EmptyDrafter
from specgen.models import graphs
from tests.conftest import host_reads_inside
from tests.image_fixtures import tiny_image_target
from tests.models.test_graphs import capture  # noqa: F401  (fixture: static steps uncaptured, or traced)

LABELS = [[0], [1], [2]]


@pytest.fixture(scope="module")
def shipped():
    """The shipped tiny image target and drafter (it accepts: the device's verdicts and pairs are exercised) with
    static steps, and greedy AR's images of three classes."""
    from specgen.generate.image import load_image_model

    im = load_image_model("tiny-image-gpt", graphs="off")
    target = CFGTarget(im.model, 4.0)
    ar = run_batch(target, lambda i: EmptyDrafter(), LABELS, im.grid ** 2, SamplingParams())
    graphs.attach(im.model, "on", capture=False)
    graphs.attach(im.drafter_net, "on", capture=False)
    yield ImageParts(im.model, target, im.drafter_net, None, im.grid), [r.tokens for r in ar.results]
    im.model.graphs = im.drafter_net.graphs = None


def decode(parts: ImageParts, method: str, options: dict, batch: int, new: int = 0, params=SamplingParams()):
    rule = build_image_method(method, parts, options)[1]
    gens = [torch.Generator().manual_seed(40 + i) for i in range(len(LABELS))]
    return run_batch(parts.target, lambda i: build_image_method(method, parts, options)[0], LABELS,
                     new or parts.grid ** 2, params, batch_size=batch, rule=rule, generators=gens).results


SAMPLED = [SamplingParams(1.0), SamplingParams(0.8, top_k=50, top_p=0.9)]


@pytest.mark.parametrize("params", [pytest.param(SAMPLED[0], marks=pytest.mark.slow), SAMPLED[1]],
                         ids=["t1", "top-k-p"])
def test_sampled_eagle2_run_ahead_draws_what_its_per_step_trees_draw(shipped, params):
    """Sampled: each row's uniforms drawn in `plan` in the per-step judge's order, each step's walk on the device
    (`accept.walk` inside `advance`): the per-step trees' tokens and accepted counts, at batch 2 (an admission into a
    freed slot) and near the budget (fewer steps, depths cut); the control: other seeds, other images."""
    parts, _ = shipped
    for new in (64, 7):
        each = decode(parts, "eagle2", {}, 2, new, params)
        ahead = decode(parts, "eagle2", {"run_ahead": 3}, 2, new, params)
        assert [r.tokens for r in ahead] == [r.tokens for r in each], new
        assert [r.stats.accepted for r in ahead] == [r.stats.accepted for r in each], new
        assert new < 64 or sum(sum(r.stats.accepted) for r in each) > 20  # the walk accepted often
    other = run_batch(parts.target, lambda i: build_image_method("eagle2", parts, {"run_ahead": 3})[0], LABELS,
                      7, params, batch_size=2, rule=build_image_method("eagle2", parts, {})[1]).results
    assert [r.tokens for r in other] != [r.tokens for r in ahead]


def test_sampled_adt_tree_run_ahead_accepts_as_its_per_step_trees(shipped):
    """ADT-Tree's shapes adapt once a loop step (after its read) where its per-step trees adapt every step, so a seed
    draws other trees and tokens: lossless all the same (each step's shape is fixed before its uniforms are read). Its
    acceptance stays near the per-step trees' (a broken walk accepts nothing or everything)."""
    parts, _ = shipped
    params = SAMPLED[1]
    each = decode(parts, "adt-tree", {}, 2, 128, params)
    ahead = decode(parts, "adt-tree", {"run_ahead": 3}, 2, 128, params)
    accepted = [sum(sum(r.stats.accepted) for r in rs) for rs in (each, ahead)]
    assert accepted[0] > 50 and abs(accepted[1] - accepted[0]) < 0.2 * accepted[0], accepted
    assert all(len(r.tokens) == 128 for r in ahead)


@pytest.mark.parametrize("batch,ks", [(2, (2, 5)), (1, (4,))])
def test_eagle2_run_ahead_decodes_ar_with_the_per_step_trees_verdicts(shipped, batch, ks):
    """Greedy AR's images at batch 2 (an admission into a freed slot, a compaction) and 1, and each step's accepted
    count the per-step trees' (the device's verdicts and catch-ups are the host's)."""
    parts, ar = shipped
    each = decode(parts, "eagle2", {}, batch)
    for k in ks:
        ahead = decode(parts, "eagle2", {"run_ahead": k}, batch)
        assert [r.tokens for r in ahead] == ar
        assert [r.stats.accepted for r in ahead] == [r.stats.accepted for r in each]
    assert sum(sum(r.stats.accepted) for r in each) > 300  # the drafter was right often: paths of several nodes


def test_adt_tree_run_ahead_decodes_ar(shipped):
    """ADT-Tree's shapes held over a loop step (observed after its read): AR's images, and its acceptance."""
    parts, ar = shipped
    each = decode(parts, "adt-tree", {}, 2)
    ahead = decode(parts, "adt-tree", {"run_ahead": 3}, 2)
    assert [r.tokens for r in ahead] == ar
    accepted = [sum(sum(r.stats.accepted) for r in rs) for rs in (each, ahead)]
    assert abs(accepted[1] - accepted[0]) < 0.05 * accepted[0], accepted


def test_run_ahead_near_the_budget_cuts_the_trees_and_stays_ar(shipped):
    """A budget that ends inside a loop step's trees: fewer steps, then depths cut to the budget (a root alone at the
    last token), never a node past the model's positions."""
    parts, ar = shipped
    for new in (1, 2, 7):
        got = decode(parts, "eagle2", {"run_ahead": 4}, 2, new)
        assert [r.tokens for r in got] == [t[:new] for t in ar]


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED[1]], ids=["greedy", "top-k-p"])
def test_run_ahead_reads_the_host_once_a_loop_step(shipped, monkeypatch, params):
    """No host read inside a loop step's tree steps (sampled: the walk's filter and draws too); the loop step's one
    read is `settle`'s."""
    parts, ar = shipped
    reads, calls = host_reads_inside(monkeypatch, TreeAhead)
    got = decode(parts, "eagle2", {"run_ahead": 4}, 1, 0 if params.greedy else 64, params)
    assert ([r.tokens for r in got] == ar or not params.greedy) and len(calls) > 5 and reads == []


@pytest.mark.parametrize("capture", ["static", "traced"], indirect=True)
def test_run_ahead_through_traced_steps_decodes_ar(capture):  # noqa: F811  (the fixture)
    """A random drafter over traced steps (as captured: the drafter's step and `advance` replays, rerun by the
    capture's warm-up without effect), batch 2 then 1: greedy AR's tokens, and a second call replays; sampled, the
    per-step trees' tokens."""
    model = tiny_image_target(0)
    target = CFGTarget(model, 3.0)
    ar = [r.tokens for r in run_batch(target, lambda i: EmptyDrafter(), LABELS, 16, SamplingParams()).results]
    from specgen.models.eagle import EagleNet

    torch.manual_seed(1)
    net = EagleNet.from_target(model).eval()
    graphs.attach(model, "on", capture=capture)
    graphs.attach(net, "on", capture=capture)
    parts = ImageParts(model, target, net, None, 4)
    for batch in (2, 1):
        got = decode(parts, "eagle2", {"run_ahead": 3, "depth": 3, "top_k": 2, "total_tokens": 8}, batch, 16)
        assert [r.tokens for r in got] == ar, batch
    shape = {"depth": 3, "top_k": 2, "total_tokens": 8}
    each = decode(parts, "eagle2", shape, 2, 16, SAMPLED[1])
    got = decode(parts, "eagle2", {**shape, "run_ahead": 3}, 2, 16, SAMPLED[1])
    assert [r.tokens for r in got] == [r.tokens for r in each]
    assert any(isinstance(key, tuple) and key[0] == "tree-ahead" for key in net.graphs.graphs)


def test_run_ahead_refuses_what_is_not_lossless_greedy_on_captured_steps(shipped):
    parts, _ = shipped
    spec = get_method("lantern")
    with pytest.raises(UsageError, match="run_ahead .* lossless greedy rule: lantern"):
        spec.parse_options({"run_ahead": 2})
    with pytest.raises(UsageError, match="run_ahead .* needs budget=fixed"):
        get_method("adt-tree").parse_options({"run_ahead": 2, "budget": "auto"})
    eager = ImageParts(tiny_image_target(0), CFGTarget(tiny_image_target(0), 3.0), parts.drafter_net, None, 4)
    with pytest.raises(UsageError, match="run_ahead .* needs captured steps"):
        decode(eager, "eagle2", {"run_ahead": 2}, 1, 4)


def test_run_ahead_refuses_a_caption_target():
    """A t2i target's key mask hides its captions' padding: run_ahead's hidden nodes would share it, so it is refused
    in one line before any decode."""
    from specgen.models.eagle import EagleNet
    from tests.image.test_t2i_generate import tiny_t2i_gpt

    model = tiny_t2i_gpt()
    parts = ImageParts(model, None, EagleNet.from_target(model), None, 4)
    with pytest.raises(UsageError, match="run_ahead .* needs a class-conditional"):
        build_image_method("eagle2", parts, {"run_ahead": 2})
