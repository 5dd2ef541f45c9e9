"""Batched images: every lossless image method in the method table, B images x the CFG pair per forward, gives each
image exactly what it gets alone (= AR), in input order; the CFG target scores n sequences per forward."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from specgen.decoding.budget import FixedBudget, MeasuredBudget
from specgen.decoding.cost import Tokens, measure_cost
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.generate.image import MAX_DRAFT
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.target import CFGTarget
from specgen.methods import METHODS, run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models.cache import KVCache
from tests.conftest import LOSSLESS_IMAGE, decode
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image_fixtures import one_thread

GRID = 4
OPTIONS = {"eagle2": {"depth": 3, "top_k": 3, "total_tokens": 8}, "adt-tree": {"total_tokens": 8, "k0": 3}}


_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_lossless_image_methods_batched_equal_alone_and_ar(method, cfg_scale):
    model = tiny_image_gpt(5)
    target = CFGTarget(model, cfg_scale)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    labels = [0, 2, 1, 1, 2]  # batch 3 leaves a ragged last batch; batch 8 exceeds the prompts
    n = GRID * GRID
    ar = [decode(target, EmptyDrafter(), [c], n, SamplingParams()).tokens for c in labels]

    def make(i):
        return build_image_method(method, parts, dict(OPTIONS.get(method, {})))[0]

    for batch_size in (1, 3, 8):
        res = run_batch(target, make, [[c] for c in labels], n, SamplingParams(), batch_size=batch_size, max_draft=32)
        assert [r.tokens for r in res.results] == ar, batch_size
    if "budget" in METHODS[method].options:  # `budget=auto`: steps switch between AR and the tree
        res = run_batch(target, make, [[c] for c in labels], n, SamplingParams(), batch_size=3, max_draft=32,
                        budget=MeasuredBudget(32, probe_share=1.0))  # switches often
        assert [r.tokens for r in res.results] == ar
        shared = MeasuredBudget(32, cost=measure_cost(Tokens(model), rounds=1), rows_per_sequence=target.branches)
        for batch_size in (1, 3):  # batch 3 predicted from batch 1 with the target's cost curve
            res = run_batch(target, make, [[c] for c in labels], n, SamplingParams(), batch_size=batch_size,
                            max_draft=32, budget=shared)
            assert [r.tokens for r in res.results] == ar
    if method == "ar":  # K greedy steps a host read (run_ahead), the budget nearest its end shrinking the last
        for batch_size in (1, 3):
            res = run_batch(target, lambda i: build_image_method("ar", parts, {"run_ahead": 5})[0],
                            [[c] for c in labels], n, SamplingParams(), batch_size=batch_size)
            assert [r.tokens for r in res.results] == ar and all(r.stats.target_forwards == n for r in res.results)
    order = list(range(len(labels)))
    random.Random(0).shuffle(order)
    res = run_batch(target, make, [[labels[i]] for i in order], n, SamplingParams(), batch_size=3, max_draft=32)
    assert [r.tokens for r in res.results] == [ar[i] for i in order]


#: trees of more nodes than image generate's draft cap (its MAX_DRAFT sizes the loop's cache): wide and shallow
WIDE = {"eagle2": {"depth": 3, "top_k": 32, "total_tokens": MAX_DRAFT + 8},
        "adt-tree": {"d0": 3, "k0": 20, "k_max": 32, "total_tokens": MAX_DRAFT + 8}}


@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
def test_the_loop_commits_with_autograd_off_whatever_the_callers_mode(method, monkeypatch):
    """The loop's own ops run with autograd off, where a device's one-launch kernels run (`kernel_choice.one_pass`: on
    CUDA a tree path's commit is one `commit_slots` launch, not four indexing ops), for a caller with autograd on too
    (a script, a notebook, `generate_images`)."""
    modes = []
    commit = KVCache.commit_seqs

    def recorded(self, keeps, branches):
        modes.append(torch.is_grad_enabled())
        commit(self, keeps, branches)

    monkeypatch.setattr(KVCache, "commit_seqs", recorded)
    model = tiny_image_gpt(5)
    parts = ImageParts(model, CFGTarget(model, 3.0), TinyEagle(model).eval(), None, GRID)
    with torch.enable_grad():
        run_batch(parts.target, lambda i: build_image_method(method, parts, dict(OPTIONS.get(method, {})))[0],
                  [[0], [2]], GRID * GRID, SamplingParams(), batch_size=2, max_draft=32)
    assert modes and not any(modes)


@pytest.mark.parametrize("method", sorted(WIDE))
def test_trees_of_more_nodes_than_the_draft_cap_equal_ar(method):
    """`total_tokens` has no upper bound: the loop's cache holds a whole tree's nodes whatever the draft cap."""
    model = tiny_image_gpt(5)
    target = CFGTarget(model, 3.0)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    n = GRID * GRID
    ar = [decode(target, EmptyDrafter(), [c], n, SamplingParams()).tokens for c in (0, 2)]
    res = run_batch(target, lambda i: build_image_method(method, parts, dict(WIDE[method]))[0], [[0], [2]], n,
                    SamplingParams(), batch_size=2, max_draft=MAX_DRAFT)
    assert [r.tokens for r in res.results] == ar
    assert max(size for r in res.results for size in r.stats.draft_sizes) > MAX_DRAFT


#: deep trees of wide beams: their levels write more drafter cache slots than the prompt's and image's together
DEEP = {"eagle2": {"depth": 30, "top_k": 30, "total_tokens": 60},
        "adt-tree": {"d_max": 32, "d0": 30, "k_max": 32, "k0": 30, "total_tokens": 60}}


@pytest.mark.parametrize("method", sorted(DEEP))
def test_deep_wide_trees_fit_the_drafters_cache_and_equal_ar(method):
    """A growth writes depth - 1 levels of top_k slots past the drafter's committed pairs: its cache holds the
    largest tree's, whatever the depth and width (6 x 6 grid: 35 x 30 slots at the first tree)."""
    model = tiny_image_gpt(5, grid=6, vocab=64)
    target = CFGTarget(model, 3.0)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, 6)
    ar = [decode(target, EmptyDrafter(), [c], 36, SamplingParams()).tokens for c in (0, 2)]
    res = run_batch(target, lambda i: build_image_method(method, parts, dict(DEEP[method]))[0], [[0], [2]], 36,
                    SamplingParams(), batch_size=2, max_draft=MAX_DRAFT)
    assert [r.tokens for r in res.results] == ar


def test_cfg_target_scores_n_sequences_like_one_at_a_time():
    """A forward over 2 sequences (4 cache rows) gives each sequence the CFG logits it gets alone."""
    model = tiny_image_gpt(6)
    target = CFGTarget(model, 2.5)
    tokens = torch.tensor([[3, 4, 5], [7, 8, 9]])
    positions = torch.tensor([[1, 2, 3], [1, 2, 3]])
    both = target.new_cache(2, 8)
    for i, label in enumerate((0, 2)):
        view = both.rows(2 * i, 2 * i + 2)
        target.prefill(torch.tensor([[label]]), view)
        both.absorb(view, 2 * i)
    joint = target.forward(tokens, positions, both, None).logits  # [2, 3, V]
    for i, label in enumerate((0, 2)):
        one = target.new_cache(1, 8)
        target.prefill(torch.tensor([[label]]), one)
        alone = target.forward(tokens[i : i + 1], positions[i : i + 1], one, None).logits
        torch.testing.assert_close(joint[i : i + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
def test_t2i_captions_batched_equal_each_alone(method):
    """Captions with different padding share one forward: each row's key mask hides its own padded slots."""
    from specgen.image.target import CaptionCFGTarget
    from tests.image.test_t2i_generate import N_COND, caption, tiny_t2i_gpt

    model = tiny_t2i_gpt(3)
    caps = [caption(i, n_valid) for i, n_valid in enumerate([2, 6, 4, 1, 5])]
    target = CaptionCFGTarget(model, 3.0, caps)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    n = GRID * GRID
    alone = [decode(CaptionCFGTarget(model, 3.0, c), EmptyDrafter(), [0] * N_COND, n, SamplingParams()).tokens
             for c in caps]
    res = run_batch(target, lambda i: build_image_method(method, parts, dict(OPTIONS.get(method, {})))[0],
                    [target.prompt(i) for i in range(len(caps))], n, SamplingParams(), batch_size=3, max_draft=32)
    assert [r.tokens for r in res.results] == alone


def test_steps_the_budget_cuts_to_ar_are_not_shown_to_the_tree_policy():
    """ADT-Tree adapts its next tree to how its trees fared: a step the loop's budget ran as AR (no tree) must not
    count as a tree that failed."""
    model = tiny_image_gpt(5)
    target = CFGTarget(model, 3.0)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    seen = []

    def make(i):
        drafter = build_image_method("adt-tree", parts, dict(OPTIONS["adt-tree"]))[0]
        observe = drafter.policy.observe
        drafter.policy.observe = lambda *a: (seen.append(a), observe(*a))
        return drafter

    n = GRID * GRID
    run_batch(target, make, [[0], [1]], n, SamplingParams(), batch_size=2, max_draft=32, budget=FixedBudget(0))
    assert seen == []
    run_batch(target, make, [[0], [1]], n, SamplingParams(), batch_size=2, max_draft=32, budget=FixedBudget(32))
    assert seen


SCALE = 0.5  # the tiny GPT's weights scaled down: flatter logits


def exact_cfg_joint(target: CFGTarget, label: int, n: int, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """p(t_1..t_n | label) of the CFG target under `params`' filters, every sequence with mass: each prefix scored
    as one causal chain after the class (the same cache, never committed)."""
    cache = target.new_cache(1, n + 2)
    first = target.prefill(torch.tensor([[label]]), cache).logits[0, -1]
    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def dist(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in memo:
            logits = first if not prefix else target.forward(
                torch.tensor([prefix]), torch.arange(1, 1 + len(prefix))[None], cache, None).logits[0, -1]
            memo[prefix] = logits_to_probs(logits, params)
        return memo[prefix]

    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        joint = {pre + (t,): w * float(dist(pre)[t]) for pre, w in joint.items()
                 for t in dist(pre).nonzero().flatten().tolist()}
    return joint


@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
def test_sampled_images_keep_the_cfg_targets_distribution_and_the_control_fails(method):
    """Every lossless image method under CFG (scale 3) at temperature 0.5, top-k 3, top-p 0.9: 600 images' first 4
    tokens, 3 classes interleaved in batches of 8, each its own stream; Pearson's chi-square against the exact
    filtered joint of the CFG logits below its 0.999 quantile (fixed seeds). A 4-token vocabulary puts every tree
    node in the target's support; the control, the same images judged without the residual (`siblings_against_p`),
    is above the quantile (AR drafts nothing: no control)."""
    from tests.decoding.test_batched import FILTERED, chi_square, chi_square_limit, siblings_against_p

    model = tiny_image_gpt(5, vocab=4)
    for p in model.parameters():  # CFG and temperature 0.5 leave 24 sequences with mass
        p.data.mul_(SCALE)
    target = CFGTarget(model, 3.0)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    exact = exact_cfg_joint(target, 0, 4, FILTERED)
    limit = chi_square_limit(exact)
    labels = [i % 3 for i in range(1800)]  # 600 of class 0, interleaved with the others

    def counts(rule) -> Counter:
        res = run_batch(target, lambda i: build_image_method(method, parts, dict(OPTIONS.get(method, {})))[0],
                        [[c] for c in labels], 4, FILTERED, generators=[torch.Generator().manual_seed(i)
                                                                         for i in range(len(labels))],
                        batch_size=8, max_draft=32, rule=rule)
        return Counter(tuple(r.tokens) for r, c in zip(res.results, labels) if c == 0)

    got = chi_square(counts(None), exact)
    assert got < limit, (got, limit)
    if method != "ar":
        control = chi_square(counts(siblings_against_p), exact)
        assert control > limit, (control, limit)


class FlatVQ(torch.nn.Module):
    """A VQ stand-in: a codebook, and grey pixels for any grid (the test reads tokens)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.quantize = torch.nn.Module()
        self.quantize.embedding = torch.nn.Embedding(vocab, 4)

    def decode_indices(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(idx.shape[0], 3, 1, 1)


def test_a_sampled_auto_budget_run_repeats_with_its_seed_whatever_the_step_times(monkeypatch):
    """`generate_images` under `budget=auto` at temperature 1: one run whose tree steps time 10x faster than AR's,
    one whose time 10x slower, draw the same images from the same seed (a sampled row's draws follow whether its
    steps drafted, so a choice by wall time made them differ)."""
    from specgen.generate.image import ImageGenConfig, ImageModel, generate_images
    from specgen.request import parse_request
    from tests.budget_fixtures import step_times

    from specgen.models.eagle import EagleNet

    model = tiny_image_gpt(5, grid=6)
    drafter = EagleNet.from_target(model).eval()  # with a config: its forwards' curve is timed (MeasuredBudget 6.)
    cfg = ImageGenConfig(method="adt-tree", num=4, batch_size=2, temperature=1.0, seed=3,
                         method_options={**OPTIONS["adt-tree"], "budget": "auto"})

    def tokens(tree_seconds: float) -> list[list[int]]:
        step_times(monkeypatch, lambda cap: tree_seconds if cap else 1.0)
        im = ImageModel(None, model, FlatVQ(32), ["a", "b", "c"], 6, drafter)  # a new budget: nothing measured
        return [s.tokens for s in generate_images(im, parse_request(cfg, "image"))[0]]

    assert tokens(0.1) == tokens(10.0)


@pytest.mark.parametrize("method", ["eagle2", "adt-tree", "lantern", "adt-tree+lantern"])
def test_a_sampled_auto_budget_costs_each_tree_step_with_its_drafters_forwards(monkeypatch, method):
    """Sampled `budget=auto` (MeasuredBudget 6.): every image tree method reports its drafter's forwards (the
    catch-up, then one a level: at batch 1 as many as `DecodeStats.drafter_forwards` counts), and a step's cost is its
    verify's plus theirs at the drafter's curve, in the target's unit; an AR step runs and costs no drafter."""
    from specgen.generate.image import ImageGenConfig, ImageModel, generate_images
    from specgen.models.eagle import EagleNet
    from specgen.request import parse_request

    steps = []  # (drafter forwards, the step's cost, its verify's cost)
    untimed = MeasuredBudget.untimed
    monkeypatch.setattr(MeasuredBudget, "untimed", lambda self, verified, forwards: steps.append(
        (list(forwards), untimed(self, verified, forwards), self.cost(self.rows_per_sequence * verified)))
        or steps[-1][1])
    model = tiny_image_gpt(5, grid=6)
    im = ImageModel(None, model, FlatVQ(32), ["a", "b", "c"], 6, EagleNet.from_target(model).eval())
    options = {**OPTIONS.get(method.split("+")[0], OPTIONS["eagle2"]), "budget": "auto"}
    cfg = ImageGenConfig(method=method, num=2, temperature=1.0, seed=3, method_options=options)
    samples = generate_images(im, parse_request(cfg, "image"))[0]
    assert sum(len(f) for f, _, _ in steps) == sum(s.stats.drafter_forwards for s in samples) > 0
    assert all((cost > verify) == bool(forwards) for forwards, cost, verify in steps)
    assert any(not forwards for forwards, _, _ in steps)  # AR steps too (batch 1 measures both)
