"""The auto draft budget's choice, the cost curve it reads (and its file), and the cache-size refusal."""

from __future__ import annotations

import json
import shutil
import time
import weakref

import pytest
import torch

from specgen import memory, native
from specgen.decoding import cost
from specgen.decoding.budget import AutoBudget, FixedBudget, MeasuredBudget, steady_rate
from specgen.decoding.cost import CostCurve, measure_cost
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.step_times import StepTimes
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.generate.text import TextGenConfig, draft_budget
from specgen.methods import run_batch
from specgen.models import kernel_choice, plan_cache
from specgen.models.cache import KVCache
from specgen.request import parse_request
from tests.conftest import method_drafter, tiny_model


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve((1, 2, 4), (1.0, 1.2, 2.0))
    assert c(1) == 1.0 and c(2) == 1.2 and c(3) == pytest.approx(1.6)
    assert c(6) == pytest.approx(2.8)  # the last slope, 0.4 per row


def test_measured_cost_is_relative_to_one_token_and_never_falls():
    curve = measure_cost(cost.Tokens(tiny_model(0)), rows=(1, 2, 8, 64), rounds=1)
    assert curve.rows == (1, 2, 8, 64) and all(c > 0 for c in curve.cost)
    assert list(curve.cost) == sorted(curve.cost) and curve.cost[0] <= 1.0


def counted_measure(monkeypatch) -> list:
    """Every `measure_cost` of `cost_of`, recorded, answering a plausible curve (a real one timed while the machine is
    loaded can be implausible, and is measured again: `cost.plausible`); each test's SPECGEN_HOME starts empty."""
    calls = []
    monkeypatch.setattr(cost, "measure_cost", lambda m: calls.append(m) or CostCurve((1, 2, 8), (1.0, 1.4, 3.0)))
    return calls


def new_process(monkeypatch) -> None:
    monkeypatch.setattr(cost, "_CURVES", weakref.WeakKeyDictionary())


def test_a_stored_cost_curve_is_read_on_the_next_start_without_timing(monkeypatch):
    calls = counted_measure(monkeypatch)
    first = cost.cost_of(cost.Tokens(tiny_model(0)))
    assert len(calls) == 1 and cost.path().is_file()
    new_process(monkeypatch)
    monkeypatch.setattr(cost, "now", lambda device: pytest.fail("a stored curve is timed again"))
    assert cost.cost_of(cost.Tokens(tiny_model(1))) == first and len(calls) == 1  # other weights, same structure: read


def test_an_implausible_curve_is_never_kept_and_a_stored_one_is_measured_again(monkeypatch):
    """An implausible stored curve (c(8) = 150: the one-token forward timed alone while the cores were shared) is
    measured again and replaced; one measured implausible is used by this process, once (no second timing: a quiet
    timing was never implausible in 24 here, `timed_quietly` keeps a busy one from the file), and not stored."""
    busy = cost.CostCurve((1, 2, 8), (1.0, 1.6, 150.0))
    calls = counted_measure(monkeypatch)
    model = tiny_model(0)
    plan_cache.add(cost.path(), cost.key(cost.Tokens(model)), {"rows": list(busy.rows), "cost": list(busy.cost)})
    quiet = cost.cost_of(cost.Tokens(model))
    stored = plan_cache.read(cost.path())[cost.key(cost.Tokens(model))]
    assert len(calls) == 1 and cost.plausible(quiet) and stored["cost"] == list(quiet.cost)
    new_process(monkeypatch)
    plan_cache.add(cost.path(), cost.key(cost.Tokens(model)), {"rows": [1, 2, 8], "cost": [1.0, 99.0, 99.0]})
    monkeypatch.setattr(cost, "measure_cost", lambda m: calls.append(m) or busy)
    assert cost.cost_of(cost.Tokens(model)) == busy and len(calls) == 2  # timed once: used by this process only
    kept = plan_cache.read(cost.path())[cost.key(cost.Tokens(model))]
    assert kept["cost"] == [1.0, 99.0, 99.0]  # not replaced by a busy one
    assert not cost.plausible(busy) and cost.plausible(cost.CostCurve((1, 2, 8), (1.0, 1.9, 7.5)))


def test_a_curve_timed_while_its_thread_lost_the_core_is_used_and_not_stored(monkeypatch):
    """A sleep in the timing is wall time the timing thread did not run, as when another process takes the core."""
    calls = counted_measure(monkeypatch)
    measure = cost.measure_cost
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.9)
    monkeypatch.setattr(cost, "measure_cost", lambda m: time.sleep(0.05) or measure(m))
    model = tiny_model(0)
    assert cost.cost_of(cost.Tokens(model)).cost == (1.0, 1.4, 3.0) and len(calls) == 1 and not cost.path().exists()
    new_process(monkeypatch)
    monkeypatch.setattr(cost, "measure_cost", measure)
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.0)  # a quiet start (whatever else runs beside this test)
    cost.cost_of(cost.Tokens(model))
    assert len(calls) == 2 and plan_cache.read(cost.path())[cost.key(cost.Tokens(model))]["cost"] == [1.0, 1.4, 3.0]


@pytest.mark.parametrize("change", ["threads", "kernels", "sources", "shapes", "rule"])
def test_a_changed_key_measures_again(monkeypatch, tmp_path, request, change):
    calls = counted_measure(monkeypatch)
    cost.cost_of(cost.Tokens(tiny_model(0)))
    new_process(monkeypatch)
    model = tiny_model(0)
    if change == "threads":
        threads = torch.get_num_threads()
        request.addfinalizer(lambda: torch.set_num_threads(threads))
        torch.set_num_threads(threads % 2 + 1)  # another count
    elif change == "kernels":
        monkeypatch.setattr(native, "describe", lambda: "another int4 kernel")
    elif change == "sources":
        for f in native.SOURCE_DIR.glob("*.[ch]"):
            shutil.copy(f, tmp_path)
        (tmp_path / "qmm.c").write_text("/* a replaced product kernel */")
        monkeypatch.setattr(native, "SOURCE_DIR", tmp_path)
    elif change == "rule":  # bfloat16 products on AMX slices where they were on tiled.c (or back)
        monkeypatch.setattr(kernel_choice, "cpu_rule", lambda: "another product rule")
    else:
        model = tiny_model(0, ffn_dim=96)
    cost.cost_of(cost.Tokens(model))
    assert len(calls) == 2 and len(plan_cache.read(cost.path())) == 2


@pytest.mark.parametrize("text", ["{not json", '{"KEY": {"rows": [1, 2], "cost": [1.0], "unit": 0.01}}',
                                  '{"KEY": {"rows": [1, 2], "cost": [1.0, 1.2]}}'])  # stored before curves had a unit
def test_a_corrupt_cost_file_or_entry_is_measured_again_and_rewritten(monkeypatch, text):
    calls = counted_measure(monkeypatch)
    model = tiny_model(0)
    cost.path().parent.mkdir(parents=True)
    cost.path().write_text(text.replace("KEY", cost.key(cost.Tokens(model))))
    curve = cost.cost_of(cost.Tokens(model))
    assert len(calls) == 1
    stored = json.loads(cost.path().read_text())[cost.key(cost.Tokens(model))]
    assert stored == {"rows": list(curve.rows), "cost": list(curve.cost), "unit": curve.unit}


def test_an_unwritable_cost_folder_warns_once_and_still_decodes(monkeypatch, tmp_path):
    calls = counted_measure(monkeypatch)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "file" / "home"))  # under a file
    monkeypatch.setattr(plan_cache, "WARNED", set())
    model, prompts = tiny_model(0), [[5, 17, 3, 5, 17, 3, 5], [11, 11, 7]]

    def decode(budget):
        res = run_batch(ModelTarget(model), lambda i: method_drafter("ngram"), prompts, 12, SamplingParams(), (),
                        batch_size=2, budget=budget)
        return [r.tokens for r in res.results]

    with pytest.warns(UserWarning, match="cost curves") as warned:
        auto = decode(AutoBudget(16, cost.cost_of(cost.Tokens(model))))
        new_process(monkeypatch)
        cost.cost_of(cost.Tokens(model))
    assert len([w for w in warned if "not cached" in str(w.message)]) == 1 and len(calls) == 2
    assert auto == decode(FixedBudget(0))  # batched AR


def test_ngram_defaults_to_the_auto_budget_and_fixed_runs_its_own_draft_size():
    assert parse_request(TextGenConfig(method="ngram"), "text").budget == "auto"
    fixed = parse_request(TextGenConfig(method="ngram", method_options={"budget": "fixed"}), "text")
    assert fixed.budget == "fixed" and draft_budget(None, fixed.budget) is None  # the loop's FixedBudget
    assert parse_request(TextGenConfig(method="jacobi"), "text").budget == "fixed"  # the other methods keep theirs


def test_auto_budget_drafts_when_verification_is_cheap_and_acceptance_high():
    flat = AutoBudget(8, CostCurve((1, 1024), (1.0, 1.0)), prior=0.9)
    assert flat.best(1) == 8  # free verification: draft as much as allowed


def test_auto_budget_is_batched_ar_when_each_token_costs_a_forward():
    linear = AutoBudget(8, CostCurve((1, 1024), (1.0, 1024.0)), prior=0.9)
    assert linear.best(1) == 0 and linear.best(16) == 0  # k tokens cost k forwards and E(k) < k + 1


def test_auto_budget_shrinks_as_the_batch_fills_the_product():
    """c(m) flat up to 16 rows, then linear: one row drafts, a batch of 16 does not."""
    knee = AutoBudget(8, CostCurve((1, 16, 1024), (1.0, 1.0, 64.0)), prior=0.7)
    assert knee.best(1) >= 4 and knee.best(16) == 0
    assert knee.best(4) <= knee.best(1)


def test_auto_budget_learns_a_trees_acceptance_along_its_depth_and_prices_its_width():
    """A tree's tokens are tried along one path (its depth), and its verify holds all its nodes: a 12-node, 4-level
    tree accepted whole tried 4 tokens (a chain's count would call it 5: one rejected), and a cap of k levels then
    costs 1 + 3k rows a sequence; chains keep 1 + k."""
    curve = CostCurve((1, 2, 4, 8, 16, 32), (1.0, 1.3, 1.8, 2.8, 5.0, 9.0))
    chain, tree = AutoBudget(8, curve, prior=0.5, weight=8.0), AutoBudget(8, curve, prior=0.5, weight=8.0)
    chain.observe(4, 4, 4)
    tree.observe(12, 4, 4)
    assert chain.rate() == tree.rate() == pytest.approx(8 / 12)  # (4 accepted + 4 pseudo) / (4 tried + 8 pseudo)
    assert chain.model(2) == [curve(2 * (1 + k)) for k in range(9)]
    assert tree.model(2) == [curve(2 * (1 + 3 * k)) for k in range(9)]
    tree.observe(0, 0, 0)  # no draft: no shape either
    assert tree.breadth() == 3.0


def test_auto_budget_learns_the_acceptance_rate_and_retries_after_ar_steps():
    b = AutoBudget(8, CostCurve((1, 2, 4, 8, 16), (1.0, 1.3, 1.8, 2.8, 5.0)), prior=0.9)
    for _ in range(2):
        b.times.add(1, 0, 1.0)  # batched AR measured (it runs first): drafting is judged by the curve's shape
    before = b.cap(1)
    b.observe(4, 4, 0)
    assert b.rate() == pytest.approx(7.2 / 9) and b.cap(1) > 0  # one rejection does not stop drafting
    for _ in range(50):
        b.observe(4, 4, 0)  # every draft rejected at its first token: the rate falls towards 0
    low = b.rate()
    assert low < 0.15 and b.cap(1) == 0 < before  # an AR step: it forgets the oldest rejection
    forgot = b.rate()
    assert forgot > low
    b.observe(0, 0, 0)  # an empty draft says nothing about acceptance
    assert b.rate() == forgot
    steps = 0
    while b.cap(1) == 0:  # AR steps forget old observations until drafting is worth a try again
        steps += 1
    assert 0 < steps <= 50 and b.rate() > low
    assert FixedBudget(5).cap(100) == 5


def test_auto_budget_follows_measured_step_times_where_the_curve_misjudges_them():
    """The curve says verifying 16 x 5 tokens is nearly free; the measured steps say each draft token adds a whole
    AR step's cost at 16 rows (attention over 16 caches): after measuring AR and one draft width the budget stays
    with batched AR there, while one row, where the curve is right, drafts 4 after its two AR steps."""
    budget = AutoBudget(4, CostCurve((1, 128), (1.0, 1.1)), prior=0.8)
    seconds = lambda cap, b: 1.0 + (0.02 if b == 1 else 1.0) * cap  # noqa: E731
    accepted = lambda cap: min(cap, 2)  # noqa: E731
    assert run_steps(budget, 16, 64, seconds, accepted) == [0, 0, 4, 4] + [0] * 60  # 2 tokens in 5 s < 1 in 1 s
    assert budget.times.measured(16) == {0: 1.0, 4: 5.0}
    assert run_steps(budget, 1, 20, seconds, accepted) == [0, 0] + [4] * 18
    curve_only = AutoBudget(4, CostCurve((1, 128), (1.0, 1.1)), prior=0.8)
    assert curve_only.best(16) == 4  # what the curve alone would run


def test_auto_budget_probes_a_width_a_busy_machines_curve_judges_slower_than_ar():
    """The curve of the AVX2 EPYC's first start, timed while a compile shared its cores, says no draft pays (c(2)
    2.06, c(4) 2.19); the steps' own times say a 4-row verify costs 1.2 AR steps. After AR's two steps the budget
    probes the curve's best drafting width twice, then drafts on the measured times. Where each draft token truly
    costs a forward it probes twice per `memory` steps and otherwise stays with AR; an untimed budget never probes."""
    busy = CostCurve((1, 2, 4, 8), (1.0, 2.06, 2.19, 3.0))
    quiet = CostCurve((1, 2, 4, 8), (1.0, 1.08, 1.2, 1.46))
    seconds = lambda cap, b: 0.01 * quiet(cap + 1)  # noqa: E731
    assert AutoBudget(4, busy).best(1) == 0  # the curve alone: AR
    probed = AutoBudget(4, busy).best(1, narrowest=1)
    assert run_steps(AutoBudget(4, busy), 1, 40, seconds, lambda cap: cap) == [0, 0, probed, probed] + [4] * 36
    linear = run_steps(AutoBudget(4, busy, times=StepTimes(memory=20)), 1, 40, lambda cap, b: cap + 1.0, lambda c: c)
    assert [step for step, cap in enumerate(linear) if cap] == [2, 3, 23, 24]
    assert run_steps(AutoBudget(4, busy, timed=False), 1, 20, seconds, lambda cap: cap) == [0] * 20


def test_an_untimed_auto_budget_plans_from_the_curve_alone_whatever_the_steps_take():
    """A sampled run's budget (`timed` False) caps every step from the curve and the acceptance it learns, never from
    step times: the same tokens give the same caps however long steps took (so `--seed` repeats a sampled run). The
    control: the timed budget, given the same steps, changes its caps."""
    accepted = lambda cap: min(cap, 2)  # noqa: E731

    def caps(timed: bool, seconds) -> list[int]:
        return run_steps(AutoBudget(4, CostCurve((1, 128), (1.0, 1.1)), timed=timed, prior=0.8), 16, 40, seconds,
                         accepted)

    fast, slow = (lambda cap, b: 1.0), (lambda cap, b: 1.0 + cap)  # noqa: E731
    assert caps(False, fast) == caps(False, slow) == [4] * 40
    assert caps(True, fast) != caps(True, slow)


def test_auto_budget_keeps_drafting_copies_after_early_rejections():
    """Prompt lookup over a long document (issue 49, RAG): an n-gram draft is a copied span, accepted whole or rejected
    at its first token, and the first two drafts are rejected. Before, those two steps' measured tokens (1 per
    step) stood for every drafting width for `memory` (128) steps and the budget stayed with AR for the rest of the
    answer; now the tokens come from the learnt rate, and the budget drafts the copies."""
    curve = CostCurve((1, 2, 4, 8), (1.0, 1.05, 1.27, 2.15))  # the int4 SmolLM2 target's, 1 thread
    budget, caps, drafts = AutoBudget(16, curve), [], 0
    for _ in range(40):  # 128 new tokens
        cap = budget.cap(1)
        size = min(cap, 4)  # the drafter's own num_draft
        drafts += size > 0
        budget.observe(size, size, size if drafts > 2 else 0)
        budget.observe_step(0.01 * curve(size + 1))
        caps.append(cap)
    assert caps[:2] == [0, 0] and min(caps[2:]) >= 2  # AR first, then drafts throughout
    assert min(caps[-10:]) >= 4  # the drafter's whole span, once copies are accepted


def test_step_times_interpolate_between_measured_widths_and_expire():
    times = StepTimes(min_steps=2, memory=10)
    model = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    curve = lambda b: model  # noqa: E731
    assert times.estimate(4, curve) == model  # nothing measured: the curve
    for width, seconds in [(4, 5.0), (4, 5.0), (0, 1.0), (0, 1.0), (0, 1.0)]:
        times.add(4, width, seconds)
    est = times.estimate(4, curve)
    assert est[:5] == [1.0, 2.0, 3.0, 4.0, 5.0] and est[5] == pytest.approx(5.0 * 1.5 / 1.4)  # past 4: the curve
    for _ in range(8):
        times.add(4, 0, 1.0)
    assert times.measured(4) == {0: 1.0}  # width 4's steps are more than 10 steps old
    assert times.estimate(4, curve) == pytest.approx(model)  # so width 4 is judged by the curve again
    assert times.estimate(2, curve) == model  # per row count


def test_a_count_without_both_widths_measured_borrows_a_near_one():
    times = StepTimes(min_steps=1)
    for width, seconds in [(0, 1.0), (4, 8.0)]:  # each draft token costs nearly two AR steps at 16 rows
        times.add(16, width, seconds)
    curve = lambda b: [b * 1.0, b * 1.1, b * 1.2, b * 1.3, b * 1.4]  # noqa: E731
    assert times.source(16) == 16 and times.source(13) == 16 and times.source(12) == 12  # within a quarter of B
    est = times.estimate(15, curve)  # 16's measured costs, scaled by the curve from 16 to 15 rows
    assert est[0] == pytest.approx(15 / 16) and est[4] == pytest.approx(8.0 * 15 / 16)
    budget = AutoBudget(4, CostCurve((1, 128), (1.0, 1.1)), prior=0.8, times=times)
    assert budget.best(15) == 0  # 16 rows stand for 15, and there drafting lost
    assert budget.best(8) == 4 and budget.cap(8) == 0  # too far to borrow: the curve's pick, after AR first


def test_a_cache_that_cannot_fit_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 10 * 2**20)  # 10 MiB free
    with pytest.raises(UsageError, match=r"needs 256.0 MiB, over the 80% of the 10.0 MiB free that a cache may take "
                                         r".* at most 2 rows of 4096 slots fit"):
        KVCache.allocate(2, 64, 2, 4096, 32)  # K + V: 4 MiB per row, 256 MiB in all; 80% of 10 MiB holds 2 rows
    assert KVCache.allocate(2, 1, 2, 4096, 32).batch == 1
    with pytest.raises(UsageError, match="needs 10.0 MiB, over the 80% of the 10.0 MiB free"):  # the free memory
        KVCache.allocate(2, 5, 2, 2048, 32)  # holds it, a cache's share does not: said so (it read 'but 10.0 free')


def run_steps(budget: MeasuredBudget, live_rows: int, steps: int, seconds_of, accepted_of) -> list[int]:
    """Drive a budget like the loop does: cap, one observe per row, the step's time; the caps it chose."""
    caps = []
    for _ in range(steps):
        cap = budget.cap(live_rows)
        for _ in range(live_rows):
            budget.observe(cap, cap, accepted_of(cap))
        budget.observe_step(seconds_of(cap, live_rows))
        caps.append(cap)
    return caps


def test_measured_budget_keeps_the_faster_choice_per_batch_size_and_probes_the_other():
    # a tree step commits 3 tokens per row, an AR step 1: at B = 1 the tree makes 3 tokens/s (1 s steps) and AR 2
    # (0.5 s steps); at B = 8 the tree 6 (4 s steps) and AR 13.3 (0.6 s steps)
    seconds = {(1, 16): 1.0, (1, 0): 0.5, (8, 16): 4.0, (8, 0): 0.6}
    budget = MeasuredBudget(16, probe_share=0.25, tries=2)
    caps1 = run_steps(budget, 1, 24, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    # 2 measured steps of each, the first after a switch unmeasured (the tree first); then the tree. Measuring found
    # AR far behind (2/3 of the tree's rate), so it counts as a try that backs off: AR (1 + 2 steps, 1.5 s) is
    # tried once that is at most an eighth of the time run since (12 s of tree steps), not a quarter
    assert caps1 == [16, 16, 16, 0, 0, 0] + [16] * 12 + [0, 0, 0] + [16] * 3
    caps8 = run_steps(budget, 8, 12, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    assert caps8 == [16, 16, 0, 0, 0] + [0] * 7  # AR; a tree try (3 x 4 s) is not due before 96 s of AR steps
    caps8 = run_steps(budget, 8, 140, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    assert caps8 == [0] * 140  # 84 s more: still not due
    caps8 = run_steps(budget, 8, 30, lambda cap, b: seconds[(b, cap)], lambda cap: 2 if cap else 0)
    assert caps8.count(16) == 3 and "16, 16, 16" in str(caps8)  # ... then tried once (3 steps), and AR again
    assert budget.rate(1, 16) == pytest.approx(3.0) and budget.rate(8, 0) == pytest.approx(8 / 0.6)


def test_measured_budget_does_not_measure_the_step_after_a_switch():
    """A tree drafter catches up on the tokens AR committed meanwhile: that one-off cost is not the tree's rate."""
    budget = MeasuredBudget(16, tries=1)
    first = iter([50.0, 1.0, 9.0, 1.0])  # the first step of each choice is slow
    run_steps(budget, 1, 4, lambda cap, b: next(first), lambda cap: 3 if cap else 0)
    assert budget.rate(1, 16) == pytest.approx(4.0) and budget.rate(1, 0) == pytest.approx(1.0)


def test_measured_budget_tries_cost_about_their_share_catch_up_included():
    """At batch 8 the tree runs at half AR's speed and its first step after a run of AR steps costs 10 of its steps
    (the drafter's catch-up): the tries, catch-up included, take at most `probe_share` of the time. (Counting one
    step per try, as before, let them take 10% of it here.)"""
    budget, last, spent = MeasuredBudget(16), [None], {16: 0.0, 0: 0.0}

    def seconds(cap: int, rows: int) -> float:
        s = (40.0 if last[0] == 0 else 4.0) if cap else 0.6
        last[0] = cap
        return s

    for step in range(3000):
        cap = budget.cap(8)
        for _ in range(8):
            budget.observe(cap, cap, 3 if cap else 0)
        s = seconds(cap, 8)
        budget.observe_step(s)
        if step >= 10:  # after the measuring phase
            spent[cap] += s
    assert 0 < spent[16] <= budget.probe_share * (spent[16] + spent[0])


def test_measured_budget_follows_a_change_in_acceptance():
    budget = MeasuredBudget(16, probe_share=0.2, window=2)
    good = run_steps(budget, 1, 20, lambda cap, b: 1.0, lambda cap: 3 if cap else 0)
    assert good[8:].count(16) >= 8  # the tree (4 tokens/s) over AR (1)
    # the image's flat region ends: the tree commits 1 token per step and costs 2 s, AR 1 token in 1 s
    bad = run_steps(budget, 1, 60, lambda cap, b: 2.0 if cap else 1.0, lambda cap: 0)
    assert bad[-30:].count(0) >= 20  # AR now, the tree tried (1 + 3 steps) less and less often


def test_measured_budget_starts_a_new_row_count_from_a_near_one():
    """Rows end one by one at the end of a run: 7 live rows start from what 8 measured (no measuring phase)."""
    budget = MeasuredBudget(16, tries=2)
    run_steps(budget, 8, 12, lambda cap, b: 4.0 if cap else 0.6, lambda cap: 2 if cap else 0)
    assert run_steps(budget, 7, 5, lambda cap, b: 4.0 if cap else 0.6, lambda cap: 2 if cap else 0) == [0] * 5
    assert budget.rate(7, 0) == pytest.approx(budget.rate(8, 0) * 7 / 8)
    run_steps(budget, 2, 3, lambda cap, b: 1.0, lambda cap: 2 if cap else 0)  # too far from 8: measured afresh
    assert budget.rate(2, 16) == pytest.approx(6.0)


def test_measured_budget_is_not_fooled_by_one_stalled_step():
    """On an H100 one of the three measured AR steps at batch 8 stalled (a first allocation, a host hiccup) and a
    rate over the sum of their seconds kept a tree at 0.46x batched AR (docs/results/gpu.md). Here AR commits 8
    tokens in 4.4 ms and the tree 29 in 30 ms; one AR step of the measuring phase takes 40 ms."""
    stalls = iter([False, False, True])  # the AR measuring steps: the third stalls

    def seconds(cap: int, rows: int) -> float:
        if cap:
            return 0.030
        return 0.040 if next(stalls, False) else 0.0044

    budget = MeasuredBudget(16)
    caps = run_steps(budget, 8, 60, seconds, lambda cap: 2.6 if cap else 0)
    assert caps[:8] == [16] * 4 + [0] * 4  # measuring: the tree's 1 + 3 steps, then AR's (one of them stalled)
    assert caps[8:].count(16) == 0  # AR from then on (the next tree try is not due within 60 steps)
    # the control: with a sum of seconds the stalled step makes AR's rate 8 / 16.3 ms, below the tree's 29 / 30 ms
    steps = [(8, 0.0044), (8, 0.0044), (8, 0.040)]
    assert sum(t for t, _ in steps) / sum(s for _, s in steps) < 29 / 0.030 < steady_rate(steps)


def test_measured_budget_predicts_a_new_batch_size_from_the_cost_curve():
    """With the target's cost curve, a batch size is first predicted from one already measured (MeasuredBudget 5.):
    a tree 1.2x AR at batch 1 whose 17-token verify (x 2 CFG rows) becomes compute-bound at batch 8 is predicted at
    0.6x there and not measured; where the curve is flat (a launch-bound GPU) batch 8 is measured as before; and a
    wrong prediction is corrected by a later try."""
    knee = CostCurve((1, 4, 1024), (1.0, 1.0, 256.0))  # flat to 4 rows, then linear
    tree_b1 = lambda cap, b: 1.0 if cap else 0.4  # noqa: E731: 3 tokens a tree step, 1 an AR step: 3 vs 2.5 tokens/s
    accepted = lambda cap: 2 if cap else 0  # noqa: E731
    budget = MeasuredBudget(16, cost=knee, rows_per_sequence=2)
    run_steps(budget, 1, 40, tree_b1, accepted)
    ratio, step = budget.predict(8)
    assert ratio == pytest.approx(1.2 * (knee(16) / knee(2)) / (knee(272) / knee(34)), rel=0.02) and ratio < 0.75
    assert step == pytest.approx(1.0 * knee(272) / knee(34))
    assert run_steps(budget, 8, 50, lambda cap, b: 8.0 if cap else 1.6, accepted) == [0] * 50  # no measuring
    flat = MeasuredBudget(16, cost=CostCurve((1, 1024), (1.0, 1.0)), rows_per_sequence=2)
    run_steps(flat, 1, 40, tree_b1, accepted)
    assert run_steps(flat, 8, 3, lambda cap, b: 1.0 if cap else 0.4, accepted) == [16] * 3  # measured, tree first
    # the prediction is wrong here: at batch 8 the tree commits 24 tokens in 1.5 s, AR 8 in 0.9 s
    wrong = MeasuredBudget(16, cost=knee, rows_per_sequence=2)
    run_steps(wrong, 1, 40, tree_b1, accepted)
    caps = run_steps(wrong, 8, 3000, lambda cap, b: 1.5 if cap else 0.9, accepted)
    first = caps.index(16)
    assert first > 100 and caps[-100:].count(16) > 90  # AR first, then a try finds the tree ahead: it leads


def test_an_untimed_measured_budget_chooses_by_the_cost_curve_whatever_the_clock():
    """Sampled runs (`timed` False, MeasuredBudget 6.): a step costs c(tokens it verified), so the choices are the
    same whether the tree's steps time 10x faster than AR's or 10x slower: the tree (3 tokens a row from a 17-token
    verify) leads where c is flat and AR where it is linear."""
    accepted = lambda cap: 2 if cap else 0  # noqa: E731
    for curve, leader in [(CostCurve((1, 1024), (1.0, 1.0)), 16), (CostCurve((1, 1024), (1.0, 1024.0)), 0)]:
        fast, slow = (run_steps(MeasuredBudget(16, cost=curve, timed=False), 2, 200, lambda cap, b: s if cap else 1.0,
                                accepted) for s in (0.1, 10.0))
        assert fast == slow and fast[-100:].count(leader) >= 90


def test_an_untimed_measured_budget_without_a_curve_is_refused_at_construction():
    with pytest.raises(ValueError, match="cost curve"):
        MeasuredBudget(4, timed=False)


def test_an_untimed_tree_step_costs_its_drafter_forwards_at_the_drafters_curve():
    """On a launch-bound GPU the verify curve is flat (c(64) ~ c(1)) and a tree step pays its drafter's levels: an
    untimed step costs c(b V) plus each drafter forward the pool reported, at the drafter's curve scaled by its
    one-row time over the target's (`cost.relative`). A tree step of 4 drafter forwards at 0.75 of a target forward
    each (4 target forwards in all) committing 3 tokens a row loses to AR (1 token for 1); without its drafter it
    won."""
    flat = CostCurve((1, 1024), (1.0, 1.0), unit=0.002)
    drafter = cost.relative(CostCurve((1, 1024), (1.0, 1.0), unit=0.0015), flat)

    def caps(budget: MeasuredBudget) -> list[int]:
        out = []
        for _ in range(200):
            cap = budget.cap(2)
            for _ in range(2):
                budget.observe(cap, cap, 2 if cap else 0)
            budget.observe_drafter([4, 40, 40, 40] if cap else [])  # a catch-up and three levels of 2 rows
            budget.observe_step(1.0)
            out.append(cap)
        return out

    assert drafter(40) == pytest.approx(0.75)
    assert caps(MeasuredBudget(16, cost=flat, drafter=drafter, timed=False))[-100:].count(0) >= 90
    assert caps(MeasuredBudget(16, cost=flat, drafter=lambda m: 0.0, timed=False))[-100:].count(16) >= 90
    with pytest.raises(ValueError, match="drafter"):  # a drafter's forwards with no curve to cost them
        caps(MeasuredBudget(16, cost=flat, timed=False))
    timed = MeasuredBudget(16)  # wall times include the drafter already: its forwards are not counted again
    assert caps(timed)[-100:].count(16) >= 90
