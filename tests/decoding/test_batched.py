"""The batched loop: every lossless text method in the method table gives, at every batch size, exactly what each
prompt gives alone (= AR), in input order, whatever shares its batch; sampling keeps each row's distribution."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch
from scipy.stats import chi2

from specgen.decoding.accept import accept_greedy
from specgen.decoding.draft import Verdict
from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams, logits_to_probs, sample
from specgen.decoding.target import ModelTarget
from specgen.methods import METHODS, run_batch
from specgen.methods.text import EmptyDrafter
from tests.conftest import LOSSLESS_TEXT, method_drafter, tiny_model
from tests.decoding.test_lossless_text import OracleDrafter

GREEDY = SamplingParams()


def ragged_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(64) for _ in range(rng.randrange(2, 20))] for _ in range(n)]


def drafter_of(name: str, seed: int = 0, gpu: bool = False):
    return lambda i: method_drafter(name, seed, gpu)


def alone(target, name: str, prompts, n: int, stop=(), gpu: bool = False) -> list[list[int]]:
    return [run_batch(target, drafter_of(name, gpu=gpu), [p], n, GREEDY, stop).results[0].tokens for p in prompts]


@pytest.fixture(scope="module")
def ragged_ar():
    """One target, 8 ragged prompts and their AR outputs, shared by every method's test."""
    target = ModelTarget(tiny_model(7))
    prompts = ragged_prompts(8)
    return target, prompts, alone(target, "ar", prompts, 24)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-defaults", "gpu-defaults"])
@pytest.mark.parametrize("method", LOSSLESS_TEXT)
def test_every_lossless_method_batched_equals_alone_and_ar(method, gpu, ragged_ar):
    """At the CPU's option defaults and a GPU's (`options.gpu_defaults`: wider drafts, n-gram tries) alike."""
    target, prompts, ar = ragged_ar
    assert alone(target, method, prompts, 24, gpu=gpu) == ar
    for batch_size in (1, 3, 8):
        res = run_batch(target, drafter_of(method, gpu=gpu), prompts, 24, GREEDY, batch_size=batch_size)
        assert [r.tokens for r in res.results] == ar, batch_size
    order = list(range(8))
    random.Random(1).shuffle(order)
    shuffled = run_batch(target, drafter_of(method, gpu=gpu), [prompts[i] for i in order], 24, GREEDY, batch_size=3)
    assert [r.tokens for r in shuffled.results] == [ar[i] for i in order]


def test_continuous_batching_returns_each_output_once_in_input_order():
    """11 prompts through 3 slots; rows with longer oracle chunks finish first, queued prompts take their slots."""
    target = ModelTarget(tiny_model(8))
    prompts = ragged_prompts(11, seed=2)
    ar = [decode(target, EmptyDrafter(), p, 30, GREEDY).tokens for p in prompts]
    done: list[int] = []
    res = run_batch(target, lambda i: OracleDrafter(ar[i], len(prompts[i]), k=i % 4), prompts, 30, GREEDY,
                       batch_size=3, on_done=done.append)
    assert sorted(done) == list(range(11)) and done != list(range(11))  # each once; not finished in input order
    assert [r.tokens for r in res.results] == ar


def test_a_refill_prefills_every_free_slot_before_the_policy_reads_a_first_token(monkeypatch):
    """Admission queues the prefills of all free slots, then starts each row (its policy's first read of a prefill):
    on a GPU the prefills run back to back, not each behind the host's read of the last. Outputs stay AR's."""
    from specgen.decoding import loop

    target, prompts = ModelTarget(tiny_model(3)), ragged_prompts(5, seed=1)
    ar = [decode(target, EmptyDrafter(), p, 12, GREEDY).tokens for p in prompts]
    events, prefill, start = [], target.prefill, loop.Batch.start
    monkeypatch.setattr(target, "prefill", lambda tokens, cache: events.append("prefill") or prefill(tokens, cache))
    monkeypatch.setattr(loop.Batch, "start", lambda self, *a: events.append("start") or start(self, *a))
    res = run_batch(target, lambda i: EmptyDrafter(), prompts, 12, GREEDY, batch_size=3)
    assert [r.tokens for r in res.results] == ar
    assert events == ["prefill"] * 3 + ["start"] * 3 + ["prefill"] * 2 + ["start"] * 2  # 3 slots, then the 2 queued


def test_a_row_that_stops_early_stops_consuming_forwards():
    target = ModelTarget(tiny_model(3))
    short, long = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10]
    ar_short = decode(target, EmptyDrafter(), short, 30, GREEDY).tokens
    stop = ar_short[2]
    ar_long = decode(target, EmptyDrafter(), long, 30, GREEDY, stop_ids=(stop,)).tokens
    assert len(ar_long) > 10  # the long row runs well past the short one
    res = run_batch(target, lambda i: EmptyDrafter(), [short, long], 30, GREEDY, (stop,), batch_size=2)
    a, b = res.results
    assert a.tokens == ar_short[: ar_short.index(stop) + 1]
    assert a.stats.target_forwards == len(a.tokens)  # prefill + one AR step per further token, then it left
    assert b.tokens == ar_long
    assert res.stats.target_forwards == 2 + (len(b.tokens) - 1)  # two prefills, then the long row's steps only


def test_a_rows_phase_times_are_the_batchs_while_it_lived():
    """A row is charged each batch phase it lived through (at its finish, from the batch's clock): the row that runs
    to the end has the batch's verify, accept and commit seconds; one that stopped early has less."""
    target = ModelTarget(tiny_model(3))
    short, long = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10]
    stop = decode(target, EmptyDrafter(), short, 30, GREEDY).tokens[2]
    res = run_batch(target, lambda i: EmptyDrafter(), [short, long], 30, GREEDY, (stop,), batch_size=2)
    a, b = res.results
    assert len(a.tokens) < len(b.tokens)
    for phase in ("verify", "accept", "commit"):
        assert b.stats.times[phase] == pytest.approx(res.stats.times[phase])
        assert 0 < a.stats.times[phase] < b.stats.times[phase]


def test_oracle_chunks_in_a_batch_commit_tree_paths_per_row():
    """Rows with drafts of different sizes (padded into one forward) each accept their own full chunk."""
    target = ModelTarget(tiny_model(4))
    prompts = ragged_prompts(4, seed=5)
    ar = [decode(target, EmptyDrafter(), p, 20, GREEDY).tokens for p in prompts]
    res = run_batch(target, lambda i: OracleDrafter(ar[i], len(prompts[i]), k=1 + 2 * i), prompts, 20, GREEDY,
                       batch_size=4)
    assert [r.tokens for r in res.results] == ar
    steps = [r.stats.steps for r in res.results]
    assert steps == sorted(steps, reverse=True) and steps[3] < steps[0]  # longer oracle chunks, fewer steps


# -- sampling: each row of a batch is distributed exactly as the target ------------------------------------

#: temperature below 1 with top-k and top-p, as users sample: a verify that judged at temperature 1 or dropped a
#: filter (the first token and AR are drawn elsewhere: `PolicyBase.start`, `ArSteps`) is far from the exact joint
FILTERED = SamplingParams(0.5, 3, 0.9)
#: its last bigram [1, 2] occurred before (CPU n-gram drafts), its last token follows two different ones (GPU n-gram
#: tries have siblings), and Jacobi's refill draws from it
PROMPT = [2, 1, 2, 3, 1, 2]


def exact_joint(model, prompt: list[int], n: int, params: SamplingParams = SamplingParams(1.0)
                ) -> dict[tuple[int, ...], float]:
    """p(t_1..t_n | prompt) under `params`' filters for every sequence over the tiny vocabulary with mass
    (teacher-forced, no cache)."""
    v = model.cfg.vocab_size
    seqs = list(itertools.product(range(v), repeat=n))
    ids = torch.tensor([prompt + list(s) for s in seqs])
    with torch.inference_mode():
        logits, _ = model(ids, torch.arange(ids.shape[1]).expand_as(ids))
    probs = logits_to_probs(logits[:, len(prompt) - 1 : -1], params)  # [seqs, n, V]
    tok = ids[:, len(prompt):]
    joint = probs.gather(-1, tok[..., None])[..., 0].prod(-1)
    return {s: float(p) for s, p in zip(seqs, joint) if p > 0}


def sample_rows(target, prompt, method="jacobi", rule=None, copies=600, seed=0, gpu=False, n=3,
                params=SamplingParams(temperature=1.0)) -> Counter:
    """`copies` rows of `prompt` (`n` tokens each), interleaved with ragged other prompts, in batches of 8, each its own
    stream."""
    prompts, mine = [], []
    others = ragged_prompts(copies // 2, seed=seed)
    for i in range(copies):
        mine.append(len(prompts))
        prompts.append(list(prompt))
        if i % 2:
            prompts.append([t % 4 for t in others[i // 2]])
    generators = [torch.Generator().manual_seed(10_000 * seed + i) for i in range(len(prompts))]
    opts = {"block_size": 3} if "block_size" in METHODS[method].options else {}  # ar and ngram have no blocks
    res = run_batch(target, lambda i: method_drafter(method, i, gpu, **opts), prompts, n, params,
                    generators=generators, batch_size=8, rule=rule)
    return Counter(tuple(res.results[i].tokens) for i in mine)


def tv(counts: Counter, exact: dict) -> float:
    n = sum(counts.values())
    return 0.5 * sum(abs(counts[k] / n - p) for k, p in exact.items())


def chi_square(counts: Counter, exact: dict) -> float:
    """Pearson's statistic of `counts` against the exact probabilities (every count must fall on a cell with mass)."""
    n = sum(counts.values())
    assert set(counts) <= set(exact), set(counts) - set(exact)
    return sum((counts[k] - n * p) ** 2 / (n * p) for k, p in exact.items())


def chi_square_limit(exact: dict) -> float:
    """The 0.999 quantile of the statistic under the exact distribution: one false alarm in 1000 fixed seeds."""
    return float(chi2.ppf(0.999, len(exact) - 1))


def siblings_against_p(draft, logits, params, generator):
    """Control: a rule that tries each draft node against p instead of the residual (a rejected token keeps its
    mass, so a rejection can draw it again): the classic bug of speculative sampling."""
    probs, node, path = logits_to_probs(logits, params), -1, []  # [S, V]
    while True:
        p = probs[node + 1]
        nxt = next((c for c in draft.tree.children[node + 1]
                    if float(torch.rand((), generator=generator)) < float(p[draft.tokens[c]])), None)
        if nxt is None:
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (sample(p, generator),))
        path.append(nxt)
        node = nxt


@pytest.fixture(scope="module")
def flat_model():
    model = tiny_model(5, vocab_size=4, dim=16)
    for p in model.parameters():  # flatter logits so many sequences have mass
        p.data.mul_(0.5)
    return model


@pytest.fixture(scope="module")
def filtered_model():
    """`flat_model`'s weights at 0.7: at temperature 0.5 a draft's token has p ~0.3-0.8, tried often, often rejected."""
    model = tiny_model(5, vocab_size=4, dim=16)
    for p in model.parameters():
        p.data.mul_(0.7)
    return model


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-defaults", "gpu-defaults"])
@pytest.mark.parametrize("method", LOSSLESS_TEXT)
@pytest.mark.slow
def test_rejection_sampling_in_a_batch_keeps_each_rows_distribution(flat_model, method, gpu):
    exact = exact_joint(flat_model, [1, 2, 3], 3)
    target = ModelTarget(flat_model)
    got = tv(sample_rows(target, [1, 2, 3], method, gpu=gpu), exact)
    noise = noise_tv(exact)
    assert got < 1.5 * noise + 0.02, (got, noise)


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["cpu-defaults",
                                                                                       "gpu-defaults"])
@pytest.mark.parametrize("method", LOSSLESS_TEXT)
def test_filtered_sampling_keeps_each_rows_distribution_and_its_control_fails(filtered_model, method, gpu):
    """Every lossless text method at temperature 0.5, top-k 3, top-p 0.9: 800 rows of 4 tokens in batches, Pearson's
    chi-square against the exact filtered joint (26 cells) below its 0.999 quantile (fixed seeds). The control, the
    same rows judged by a rule without the residual (`siblings_against_p`), is above it: the method's drafts are
    tried often enough for the test to fail (AR drafts nothing: no control)."""
    exact, target = exact_joint(filtered_model, PROMPT, 4, FILTERED), ModelTarget(filtered_model)
    limit = chi_square_limit(exact)
    got = chi_square(sample_rows(target, PROMPT, method, copies=800, gpu=gpu, n=4, params=FILTERED), exact)
    assert got < limit, (got, limit)
    if method != "ar":
        control = sample_rows(target, PROMPT, method, rule=siblings_against_p, copies=800, gpu=gpu, n=4,
                              params=FILTERED)
        assert chi_square(control, exact) > limit, (chi_square(control, exact), limit)


def noise_tv(exact, draws: int = 600) -> float:
    """The TV of `draws` exact draws from the same distribution (a few repeats, the largest): the test's noise level."""
    g = torch.Generator().manual_seed(0)
    keys, probs = list(exact), torch.tensor(list(exact.values()))
    return max(tv(Counter(keys[i] for i in torch.multinomial(probs, draws, True, generator=g).tolist()), exact)
               for _ in range(5))


@pytest.mark.slow
def test_an_ngram_tries_rejection_sampling_keeps_the_distribution_and_its_control_fails(flat_model):
    """GPU n-gram drafts (a trie of the 4 latest matches' continuations) sampled in a batch: the prompt's last token
    follows two earlier ones with different continuations, so the root has siblings. The TV to the exact joint is at
    noise level; the control, a rule that tries each sibling against p instead of the residual, is far off."""

    def first_two(counts) -> Counter:  # the first drafted step decides token 2: its marginal, less noisy than all 3
        out = Counter()
        for seq, n in counts.items():
            out[seq[:2]] += n
        return out

    prompt = [1, 2, 1, 3, 1]  # token 1 = 1 (p ~0.45) drafts a trie of 3 siblings: what followed each earlier 1
    exact, target = first_two(exact_joint(flat_model, prompt, 3)), ModelTarget(flat_model)
    limit = 1.5 * noise_tv(exact, 1200) + 0.02
    got = tv(first_two(sample_rows(target, prompt, "ngram", copies=1200, gpu=True)), exact)
    control = tv(first_two(sample_rows(target, prompt, "ngram", rule=siblings_against_p, copies=1200, gpu=True)), exact)
    assert got < limit < control, (got, limit, control)


def test_the_sampling_test_can_fail(flat_model):
    """Control: a rule that accepts every draft token is far from the target in the same test."""

    def accept_all(draft, logits, params, generator):
        path = tuple(range(draft.size)) if draft.tree.is_chain else ()
        greedy = accept_greedy(draft, logits.argmax(-1).tolist())
        return Verdict(path, tuple(draft.tokens[i] for i in path) + (greedy.tokens[-1],))

    exact = exact_joint(flat_model, [1, 2, 3], 3)
    assert tv(sample_rows(ModelTarget(flat_model), [1, 2, 3], rule=accept_all, copies=300), exact) > 0.2


def test_a_rows_view_of_a_batch_forward_is_made_only_when_its_drafter_reads_it():
    """EachRow hands each row's drafter a RowOut: the same slices as the row's own TargetOut (padding dropped, its
    branch rows), made on first read, so drafters that read nothing (AR's) cost no tensor op a row."""
    from specgen.decoding.pool import EachRow, RowOut
    from specgen.decoding.target import TargetOut
    from tests.decoding.test_lossless_text import CountOps

    class Reads(EmptyDrafter):
        def on_accept(self, draft, verdict, out):
            self.seen = (out.logits, out.features, out.picks())

    out = TargetOut(torch.randn(3, 5, 7), torch.randn(6, 5, 2), [[1, 2, 3, 4, 5], [6, 5, 4, 3, 2], [0] * 5])
    pool = EachRow(lambda i: EmptyDrafter())
    pool.open(3, 8)
    pool.rows = [EmptyDrafter(), Reads(), EmptyDrafter()]
    with CountOps() as ops:
        pool.on_accept([None] * 3, [None] * 3, out, [2, 4, 1], 2)
    with CountOps() as alone:
        out.logits[1:2, :4], out.features[2:4, :4]
    assert ops.n == alone.n > 0  # the reading row's two views, no other row's
    logits, features, picks = pool.rows[1].seen
    assert torch.equal(logits, out.logits[1:2, :4]) and torch.equal(features, out.features[2:4, :4])
    assert picks == [[6, 5, 4, 3]]
    assert RowOut(TargetOut(out.logits, out.features), 2, 3, 2).picks() == out.logits[2:3, :3].argmax(-1).tolist()
