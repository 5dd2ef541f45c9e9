"""VVS: no skipping = EAGLE-2 + LANTERN (= AR at T 0 without relaxation); never two skips in a row;
post-verification restores the KV cache; a row's output does not depend on its batch (stored digests:
tests/methods/test_digests.py)."""

from __future__ import annotations

import json

import pytest
import torch

from cli.main import app
from specgen.decoding.budget import FixedBudget
from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import judge
from specgen.decoding.loop import decode_batch
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.tree import DraftTree
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.target import CFGTarget
from specgen.methods import get_method, run_batch
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.vvs import VVS, FeatureCache, after_chain, sample_path
from specgen.methods.vvs_schedule import DynamicSkip, UniformSkip, path_similarity
from tests.cli.test_cli_image import gen, runner, tiny_image  # noqa: F401  (fixture)
from tests.image.helpers import TinyEagle, tiny_image_gpt

GRID = 5
N = GRID * GRID
TREE = {"depth": 3, "top_k": 4, "total_tokens": 12}


def parts(seed=0, cfg_scale=3.0):
    model = tiny_image_gpt(seed, grid=GRID)
    codebook = torch.randn(model.cfg.vocab_size, 8, generator=torch.Generator().manual_seed(seed))
    return ImageParts(model, CFGTarget(model, cfg_scale), TinyEagle(model).eval(), codebook, GRID)


def drafter(p):
    return EagleTreeDrafter(p.drafter_net, p.model.output, FixedShape(TreeShape(3, 4, 12)),
                            max_len=64, guidance=p.target.cfg_scale)


def run_vvs(p, schedule, temperature=1.0, seed=7, target=None, **kw):
    """One image of VVS (prompt [1]) on the shared loop; (its VVS row, its result, the step policy that ran it)."""
    vvs = VVS(drafter(p), schedule, **kw)
    policy = vvs.step_policy(lambda i: vvs, p.target, judge, FixedBudget(256))
    res = decode_batch(target or p.target, policy, [[1]], N, SamplingParams(temperature),
                       generators=[torch.Generator().manual_seed(seed)])
    return vvs, res.results[0], policy


def one(p, name, options, label, params, seed):
    """One image of method `name` alone on the shared loop."""
    made, rule = build_image_method(name, p, options)
    return run_batch(p.target, lambda i: made, [[label]], N, params, (), [torch.Generator().manual_seed(seed)],
                     rule=rule).results[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("options", [{"schedule": "none"}, {"schedule": "uniform", "interval": 1000}])
def test_without_skipping_vvs_equals_eagle2_lantern(temperature, options):
    p = parts(1)
    o = {**TREE, "lantern_delta": 0.5, "lantern_k": 8}  # loose: many relaxed acceptances to compare
    params = SamplingParams(temperature)
    a = one(p, "vvs", {**o, **options}, 2, params, 3)
    b = one(p, "lantern", o, 2, params, 3)
    assert a.tokens == b.tokens and len(a.tokens) == N
    assert a.stats.accepted == b.stats.accepted and a.stats.target_forwards == b.stats.target_forwards
    assert sum(b.stats.accepted) >= 5
    assert a.stats.extras["skipped_steps"] == 0


@pytest.mark.parametrize("options", [{"schedule": "none"}, {"schedule": "uniform", "interval": 1000}])
def test_vvs_that_never_skips_nor_relaxes_is_ar_at_temperature_zero(options):
    p = parts(1)
    for label in range(3):
        vvs = one(p, "vvs", {**TREE, "lantern_delta": 0.0, **options}, label, SamplingParams(), 0)
        assert vvs.tokens == one(p, "ar", {}, label, SamplingParams(), 0).tokens


class Traced:
    """A schedule that writes each of its decisions: S (skipped) or V (verified)."""

    def __init__(self, schedule):
        self.schedule, self.pattern = schedule, ""

    def decide(self, draft, verified_run):
        skip = self.schedule.decide(draft, verified_run)
        self.pattern += "S" if skip else "V"
        return skip


@pytest.mark.parametrize("schedule", [UniformSkip(2), DynamicSkip(torch.randn(32, 8), threshold=-1.0)])
def test_never_two_skips_in_a_row_and_stats(schedule):
    traced = Traced(schedule)
    _, res, _ = run_vvs(parts(2), traced)
    pattern = traced.pattern
    assert pattern[0] == "V" and "SS" not in pattern and pattern.count("S") >= 5
    assert pattern.rstrip("V").replace("VS", "") == ""  # always-skip schedules alternate V S V S ...
    s, x = res.stats, res.stats.extras
    assert x["skipped_steps"] == pattern.count("S") and s.steps == pattern.count("V")
    assert s.target_forwards == 1 + s.steps and abs(s.tpf - N / s.target_forwards) < 1e-9
    assert x["unverified_tokens"] == x["post_verified_tokens"] + x["unverified_tail"]
    assert len(res.tokens) == N


def test_uniform_interval_pattern():
    traced = Traced(UniformSkip(3))
    run_vvs(parts(3), traced, temperature=0.0)
    assert traced.pattern.startswith("VVSVVSVVS")


def test_schedules_refuse_a_skip_after_a_skip():
    tree = Draft((1, 2, 3), DraftTree((-1, -1, 0)))
    for sched in (UniformSkip(2), DynamicSkip(torch.randn(32, 8), threshold=-1.0)):
        assert not sched.decide(tree, 0) and sched.decide(tree, 1)
        assert not sched.decide(Draft.empty(), 5)


def ar_features(p, seq, n):
    """AR-built target cache over seq[:n] (committed) and the features of positions 0 .. n - 1."""
    cache = p.target.new_cache(1, n + 1)
    first = p.target.prefill(torch.tensor([seq[:1]]), cache)
    out = p.target.forward(torch.tensor([seq[1:n]]), torch.arange(1, n)[None], cache, None)
    p.target.commit(cache, list(range(n - 1)))
    return cache, torch.cat([first.features, out.features], 1)


@pytest.mark.parametrize("refresh", [True, False])
def test_post_verification_restores_the_kv_cache_as_ar(refresh):
    p = parts(4)
    made = []  # the target cache the loop decodes in
    spy = CFGTarget(p.model, p.target.cfg_scale)
    spy.new_cache = lambda b, m: made.append(p.target.new_cache(b, m)) or made[-1]
    vvs, res, policy = run_vvs(p, UniformSkip(2), target=spy, refresh=refresh)
    assert res.stats.extras["post_verified_tokens"] > 0
    cache, n = made[0], made[0].lengths[0]
    assert cache.lengths == [n, n] and n >= N - 4  # both CFG rows; only the bonus/unverified tail is not in it
    seq = [1] + res.tokens
    ar, feats = ar_features(p, seq, n)
    assert ar.lengths == cache.lengths
    torch.testing.assert_close(cache.k[:, :, :, :n], ar.k[:, :, :, :n], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[:, :, :, :n], ar.v[:, :, :, :n], atol=1e-5, rtol=1e-4)
    net, dcache = vvs.drafter.net, policy.eagle.cache  # the batch's drafter cache: slot 0 = rows 0, 1
    m = dcache.lengths[0]  # drafter slot j = pair (f_j, x_{j+1}) at position j + 1
    ref = net.new_cache(2, 64)
    net(feats[:, :m], torch.tensor([seq[1 : m + 1]]).expand(2, -1), torch.arange(1, m + 1).expand(2, -1), ref)
    close = torch.allclose(dcache.k[:, :, :, :m], ref.k[:, :, :, :m], atol=1e-5, rtol=1e-4)
    assert close == refresh  # refresh: unverified tokens' drafter entries recomputed from fresh features


def test_path_sampling_truncates_to_the_mean_path_length():
    # paths: 0-1-2 (3), 3 (1), 0-4 (2): mean 2 -> the first path is cut to 2 nodes
    draft = Draft((5, 6, 7, 8, 9), DraftTree((-1, 0, 1, -1, 0)))
    g = torch.Generator().manual_seed(0)
    seen = {tuple(sample_path(draft, g)) for _ in range(60)}
    assert seen == {(0, 1), (3,), (0, 4)}
    full = after_chain([11, 12], draft)
    assert full.tokens == (11, 12, 5, 6, 7, 8, 9) and full.tree.parents == (-1, 0, 1, 2, 3, 1, 2)


def test_path_similarity_and_stale_features():
    codes = torch.eye(4)
    same = Draft((1, 2, 1, 2), DraftTree((-1, 0, -1, 2)))
    assert path_similarity(same, codes, 0.5, stride=1) == pytest.approx(1.0)
    differ = Draft((0, 1, 2, 3), DraftTree((-1, 0, -1, 2)))
    assert path_similarity(differ, codes, 0.5, stride=1) == pytest.approx(0.0)
    half = Draft((0, 1, 0, 3), DraftTree((-1, 0, -1, 2)))  # depth 0 equal, depth 1 orthogonal
    assert path_similarity(half, codes, 0.5, stride=1) == pytest.approx(1 / 1.5)
    assert path_similarity(Draft.chain([1, 2]), codes) == 1.0
    fc = FeatureCache(torch.arange(2.0).view(1, 2, 1), 10)
    fc.append(torch.arange(2.0, 5.0).view(1, 3, 1))
    assert fc.recent(2).flatten().tolist() == [3.0, 4.0]
    assert fc.recent(2, staleness=1).flatten().tolist() == [2.0, 3.0]
    assert fc.recent(3, staleness=4).flatten().tolist() == [0.0, 0.0, 0.0]


def test_vvs_is_labelled_lossy():
    spec = get_method("vvs")
    assert not spec.lossless and "LOSSY" in spec.summary and spec.runs_on("image")


def test_generate_vvs_cli(tiny_image):  # noqa: F811
    r = gen(tiny_image / "v", "--method", "vvs", "--format", "json", "--classes", "dog",
            "method_options.schedule=dynamic", "method_options.threshold=-1")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert all(len(i["tokens"]) == 16 for i in doc["images"]) and doc["stats"]["skipped_steps"] >= 1
    assert doc["stats"]["tpf"] > 0


@pytest.mark.parametrize("args,needle", [
    (["method_options.interval=1"], "interval must be >= 2"),
    (["method_options.schedule=sometimes"], "schedule must be one of"),
    (["method_options.threshold=3"], "threshold"),
])
def test_bad_vvs_input(tiny_image, args, needle):  # noqa: F811
    r = gen(tiny_image / "bad", "--method", "vvs", *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_benchmark_rows_for_vvs_variants(tiny_image):  # noqa: F811
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1", "--format",
                               "json", "out_dir=" + str(tiny_image / "b"), "quality=false", "temperatures=[1.0]",
                               "methods=[ar,vvs@u,vvs@d]", "method_options.vvs@d.threshold=-1"])
    assert r.exit_code == 0, r.output
    rows = {x["method"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"ar", "vvs@u", "vvs@d"}
    assert not rows["vvs@u"]["lossless"] and rows["vvs@d"]["skipped_steps"] >= 1
    assert all(x["tpf"] > 0 for x in rows.values())


@pytest.mark.slow
def test_benchmark_vvs_sweeps_add_rows_and_pareto_plots(tiny_image):  # noqa: F811
    out = tiny_image / "sweep"
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1", "--format",
                            "json", "out_dir=" + str(out), "quality=false", "temperatures=[1.0]",
                            "methods=[ar,lantern]", "options.vvs@i={schedule: uniform}",
                            "options.vvs@thr={schedule: dynamic}", "sweep.vvs@i.interval=[2,4]",
                            "sweep.vvs@thr.threshold=[-1]"])
    assert r.exit_code == 0, r.output
    rows = {x["method"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"ar", "lantern", "vvs@i=2", "vvs@i=4", "vvs@thr=-1"}
    assert rows["vvs@thr=-1"]["skipped_steps"] >= 1 and not rows["vvs@i=2"]["lossless"]
    assert (out / "vvs-u-pareto-T1.png").is_file() and (out / "vvs-d-pareto-T1.png").is_file()


def test_benchmark_refuses_a_bad_sweep_value(tiny_image):  # noqa: F811
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1",
                            "out_dir=" + str(tiny_image / "bad-sweep"), "methods=[ar]", "sweep.vvs.interval=[1]"])
    assert r.exit_code == 2 and "interval must be >= 2" in r.stderr, r.output


# --- the batched path: a row's output and counters do not depend on its batch ------------------------------

def same_stats(a, b):
    """Every counter of two runs' summaries (wall times left out)."""
    drop = ("wall_s", "tokens_per_s", "drafter_share", "latency_s")
    sa, sb = a.summary(), b.summary()
    return {k: v for k, v in sa.items() if not k.startswith("time_") and k not in drop} == \
        {k: v for k, v in sb.items() if not k.startswith("time_") and k not in drop}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("options", [{"schedule": "uniform", "interval": 2}, {"schedule": "dynamic", "threshold": 0.0}])
@pytest.mark.parametrize("stop_ids", [(), (3,)])  # (3,): ragged stopping, rows leave at different steps
def test_batched_vvs_equals_each_row_alone(temperature, options, stop_ids):
    """Each row of the batched loop (batch 3, 5 prompts, a seed each) equals the row decoded alone."""
    p = parts(1)
    o = {**TREE, "lantern_delta": 0.5, "lantern_k": 8, **options}
    labels, params = [0, 2, 1, 1, 0], SamplingParams(temperature)
    seeds = [10 + i for i in range(len(labels))]
    rule = build_image_method("vvs", p, o)[1]

    def batch(indices, batch_size):
        return run_batch(p.target, lambda i: build_image_method("vvs", p, o)[0], [[labels[i]] for i in indices], N,
                         params, stop_ids, [torch.Generator().manual_seed(seeds[i]) for i in indices], batch_size,
                         rule=rule, max_draft=32).results

    alone = [batch([i], 1)[0] for i in range(len(labels))]
    if stop_ids:
        assert len({len(r.tokens) for r in alone}) > 1  # ragged
    res = batch(range(len(labels)), 3)
    assert [r.tokens for r in res] == [r.tokens for r in alone]
    assert all(same_stats(a.stats, b.stats) for a, b in zip(alone, res))
    assert sum(r.stats.extras["skipped_steps"] for r in res) > 0
    assert all(r.stats.target_forwards < r.stats.steps + r.stats.extras["skipped_steps"] + 1 for r in alone
               if r.stats.extras["skipped_steps"])  # a skipped step runs no forward at all
