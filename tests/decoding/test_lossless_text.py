"""Greedy outputs of every text drafter (chains and trees) equal AR token for token."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import DrafterBase
from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.decoding.tree import DraftTree
from specgen.methods import run_batch
from specgen.methods.options import JacobiOptions, NgramOptions
from specgen.methods.text import TRIE_NODES, EmptyDrafter, JacobiDrafter, NgramDrafter, continuations, lookup
from specgen.text.jacobi_blocks import JacobiBlocks
from tests.conftest import method_drafter, tiny_model

GREEDY = SamplingParams()


def run(model, drafter, prompt, n=40, stop=()):
    return decode(ModelTarget(model), drafter, prompt, n, GREEDY, stop_ids=stop).tokens


class RandomTreeDrafter(DrafterBase):
    """Random trees mixing the target's true continuation with noise: exercises tree paths."""

    def __init__(self, truth: list[int], prompt_len: int, seed: int = 0):
        self.truth, self.p = truth, prompt_len
        self.g = torch.Generator().manual_seed(seed)

    def reset(self, prompt, first):
        pass

    def propose(self, seq, budget, stats):
        done = len(seq) - self.p
        parents, tokens = [], []
        frontier = [-1]
        for depth in range(min(4, budget)):
            nxt = []
            for parent in frontier:
                for _ in range(2):
                    tokens.append(int(torch.randint(0, 64, (), generator=self.g)))
                    parents.append(parent)
                    nxt.append(len(tokens) - 1)
            # plant the true token under one random frontier node at this depth
            if done + depth < len(self.truth) and torch.rand((), generator=self.g) < 0.8:
                tokens[nxt[int(torch.randint(0, len(nxt), (), generator=self.g))]] = self.truth[done + depth]
            frontier = nxt[:3]
        return Draft(tuple(tokens), DraftTree(tuple(parents)))

    def on_accept(self, draft, verdict, out):
        pass


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jacobi_and_ngram_equal_ar(seed):
    model = tiny_model(seed)
    prompt = [int(t) for t in torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(seed))]
    ar = run(model, EmptyDrafter(), prompt)
    assert len(ar) == 40
    for block in (2, 4, 9):
        assert run(model, JacobiDrafter(JacobiOptions(block), seed=seed), prompt) == ar
    assert run(model, NgramDrafter(NgramOptions(num_draft=5, max_ngram=3, min_ngram=1)), prompt) == ar


def test_stop_token_and_budget():
    model = tiny_model(3)
    prompt = [1, 2, 3, 4]
    ar = run(model, EmptyDrafter(), prompt, n=30)
    stop = ar[7]
    cut = run(model, JacobiDrafter(JacobiOptions(6)), prompt, n=30, stop=(stop,))
    assert cut == ar[: ar.index(stop) + 1]
    assert run(model, NgramDrafter(NgramOptions(min_ngram=1)), prompt, n=5) == ar[:5]


class OracleDrafter(DrafterBase):
    """Proposes the true continuation, `k` tokens at a time (every draft is accepted)."""

    def __init__(self, truth: list[int], prompt_len: int, k: int):
        self.truth, self.p, self.k = truth, prompt_len, k

    def reset(self, prompt, first):
        pass

    def propose(self, seq, budget, stats):
        done = len(seq) - self.p
        return Draft.chain(self.truth[done : done + min(self.k, budget)])

    def on_accept(self, draft, verdict, out):
        pass


def test_a_stop_token_inside_an_accepted_chunk_ends_decoding():
    """A step that accepts [.., stop, x, ..] ends the text there: no forwards are spent after it."""
    model = tiny_model(3)
    prompt = [1, 2, 3, 4]
    ar = run(model, EmptyDrafter(), prompt, n=30)
    stop = ar[7]
    assert ar[20] != stop  # the chunk's last token is not the stop token
    result = decode(ModelTarget(model), OracleDrafter(ar, len(prompt), 19), prompt, 30, GREEDY, stop_ids=(stop,))
    assert result.tokens == ar[: ar.index(stop) + 1]
    assert result.stats.target_forwards == 2  # prefill + one verify of 19 drafts (tokens 2..21)


def test_tree_drafts_equal_ar_and_accept_some():
    model = tiny_model(4)
    prompt = list(range(10))
    ar = run(model, EmptyDrafter(), prompt, n=30)
    result = decode(ModelTarget(model), RandomTreeDrafter(ar, len(prompt)), prompt, 30, GREEDY)
    assert result.tokens == ar
    assert result.stats.tau > 1.5  # planted true tokens were accepted through tree paths
    assert result.stats.tpf > 1.2


class CountOps(TorchDispatchMode):
    """Counts the ops dispatched inside it, or those of one kind (`only`: argmax, a device read each where they are
    `.tolist()`ed: the host's syncs on a GPU)."""

    def __init__(self, only=None) -> None:
        super().__init__()
        self.only, self.n = only, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += self.only is None or func is self.only
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["jacobi", "pcllm-mr", "collect-trajectories"])
def test_a_greedy_jacobi_step_reads_the_argmax_of_its_verify_once(name):
    """The accept rule's argmax is the drafter's next guesses too: one read a step for the batch (the drafters read it
    again before, one more sync a row and step on a GPU), besides each prompt's first pick."""
    model, prompts = tiny_model(2), [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    blocks = [JacobiBlocks(4, i, ()) for i in range(2)]  # collect-trajectories' drafter
    make = (lambda i: blocks[i]) if name == "collect-trajectories" else (lambda i: method_drafter(name))
    with CountOps(torch.ops.aten.argmax.default) as counted:
        res = run_batch(ModelTarget(model), make, prompts, 20, GREEDY, max_draft=4)
    assert counted.n == res.stats.steps + len(prompts)
    assert [r.tokens for r in res.results] == [run(model, EmptyDrafter(), p, 20) for p in prompts]


def scan_lookup(seq: list[int], k: int, max_ngram: int, min_ngram: int, count: int = 1) -> list[list[int]]:
    """The reference: a Python scan back from the end for the longest n-gram suffix's `count` most recent earlier
    matches' continuations."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        found = [seq[i + n : i + n + k] for i in range(len(seq) - n - 1, -1, -1) if seq[i : i + n] == seq[-n:]]
        if found:
            return found[:count]
    return []


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 3), max_size=40), st.integers(1, 6), st.integers(1, 4),
       st.integers(1, 2))
def test_prompt_lookup_finds_what_a_scan_finds(seq, k, max_ngram, min_ngram):
    assert lookup(seq, k, max_ngram, min_ngram) == next(iter(scan_lookup(seq, k, max_ngram, min_ngram)), [])
    for count in (2, 4):
        assert continuations(seq, k, max_ngram, min_ngram, count) == scan_lookup(seq, k, max_ngram, min_ngram, count)


def test_an_ngram_trie_merges_the_newest_matches_continuations_within_one_slice():
    """candidates 3: the 3 most recent matches of the suffix [7], newest first, merged on their shared prefixes
    (siblings distinct, as tree rejection sampling needs); at most TRIE_NODES nodes however many tokens they hold."""
    seq = [7, 1, 2, 3, 7, 1, 2, 4, 7, 5, 6, 9, 7]
    d = NgramDrafter(NgramOptions(num_draft=3, max_ngram=1, min_ngram=1, candidates=3)).propose(seq, 8, None)
    assert sorted(d.tree.paths()) == [[0, 1, 2], [3, 4, 5], [3, 4, 6]]
    assert d.tokens == (5, 6, 9, 1, 2, 4, 3)  # the newest continuation first; [1, 2, 3] shares [1, 2] with [1, 2, 4]
    assert all(len({d.tokens[c] for c in kids}) == len(kids) for kids in d.tree.children)
    assert NgramDrafter(NgramOptions(num_draft=3, max_ngram=1, min_ngram=1)).propose(seq, 8, None).tokens == (5, 6, 9)
    wide = list(range(100)) * 39 + [0] + [200 + i for i in range(99)] + [0]  # [0] 40 times before the last: the newest
    # followed by 200, 201, ..., the 39 others by 1, 2, ... (one shared path): 80 distinct nodes, cut to TRIE_NODES
    deep = NgramDrafter(NgramOptions(num_draft=40, max_ngram=1, min_ngram=1, candidates=4)).propose(wide, 40, None)
    assert deep.size == min(TRIE_NODES, 80) and deep.tree.max_depth() == 40


def test_the_static_cache_drafts_where_a_chain_found_nothing_and_joins_a_trie_as_its_last_branch():
    class Cache:  # the static cache's one call: a continuation of the sequence
        def draft(self, seq, k):
            return [8, 9][:k]

    seq = [7, 1, 2, 7, 3, 4, 7]
    trie = NgramDrafter(NgramOptions(num_draft=2, max_ngram=1, min_ngram=1, candidates=4), Cache())
    assert trie.propose(seq, 8, None).tokens == (3, 4, 1, 2, 8, 9)  # the newest match first, the cache's last
    chain = NgramDrafter(NgramOptions(num_draft=2, max_ngram=1, min_ngram=1), Cache())
    assert chain.propose(seq, 8, None).tokens == (3, 4)  # a match: the sequence's own continuation alone
    assert chain.propose([5, 6], 8, None).tokens == (8, 9)  # no match: the cache's


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_ngram_trie_equals_ar(seed):
    """GPU n-gram drafts (unigram matches, a trie of 4 matches' continuations) on the CPU: AR's tokens, batched too."""
    model = tiny_model(seed)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [5, 4, 5, 4, 6, 5, 4, 7]]
    drafter = lambda i: NgramDrafter(NgramOptions(num_draft=8, min_ngram=1, candidates=4))  # noqa: E731
    res = run_batch(ModelTarget(model), drafter, prompts, 40, GREEDY, batch_size=2)
    assert [r.tokens for r in res.results] == [run(model, EmptyDrafter(), p) for p in prompts]
    assert max(res.stats.depths) < max(res.stats.draft_sizes)  # some step verified a trie wider than a chain


def test_prompt_lookup_skips_a_byte_match_across_token_boundaries():
    """[1] as bytes (01 00 00 00) lies inside 256, 0 (00 01 00 00 | 00 00 00 00): not a token match."""
    assert lookup([256, 0, 1], 2, 1, 1) == [] and lookup([1, 256, 0, 1], 2, 1, 1) == [256, 0]
