"""Text drafters on the shared loop: AR (empty draft), Jacobi fixed-point guesses, n-gram prompt lookup."""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass, field

from specgen.decoding.ar_steps import ArSteps
from specgen.decoding.draft import Draft, Verdict, prefix_tree
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.pool import StepPolicy
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut
from specgen.methods.ngram_cache import NgramCache
from specgen.methods.options import JacobiOptions, NgramOptions


class EmptyDrafter(DrafterBase):
    """Autoregressive decoding: the empty draft, so a step commits exactly one token; its rows run `ArSteps` (no
    per-row drafts or verdicts), `run_ahead` > 1: that many AR steps a loop step. As a Drafter (the empty
    draft) it runs the generic draft-verify step that `ArSteps` is tested against."""

    def __init__(self, run_ahead: int = 1) -> None:
        self.run_ahead = run_ahead

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        return Draft.empty()

    def step_policy(self, make, target, rule, budget) -> StepPolicy:
        return ArSteps(self.run_ahead)


@dataclass
class JacobiDrafter(DrafterBase):
    """Jacobi decoding as draft-and-verify: the draft is the previous iteration's n - 1 guesses (freed slots: seeded
    prompt tokens, as CLLM's)."""

    o: JacobiOptions = field(default_factory=JacobiOptions)
    seed: int = 0

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        self.rng = random.Random(self.seed)
        self.pool = list(prompt)
        self.guesses: list[int] = []

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        n = max(min(self.o.block_size - 1, budget), 0)
        self.guesses = self.guesses[:n] + [self.rng.choice(self.pool) for _ in range(n - len(self.guesses))]
        return Draft.chain(self.guesses)

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        argmax = out.picks()[0]  # [N + 1]: the next Jacobi iterate
        self.guesses = argmax[verdict.num_accepted + 1 :]


# the most nodes of an n-gram trie: with its root, 64 rows, one SlicedLinear slice (models/sliced_linear.SLICE_ROWS)
TRIE_NODES = 63


@dataclass
class NgramDrafter(DrafterBase):
    """Prompt lookup: what followed the most recent earlier occurrence of the longest suffix n-gram (max_ngram down
    to min_ngram), else of the static `cache` (loaded from `o.cache`); no match: an empty draft (a plain AR step).
    `o.candidates` > 1: the continuations of that many most recent occurrences, then the cache's, merged into a trie
    (TRIE_NODES at most: a GPU verifies them as one product slice), the newest first."""

    o: NgramOptions = field(default_factory=NgramOptions)
    cache: NgramCache | None = None

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        k = min(self.o.num_draft, budget)  # the draft's depth: each continuation's tokens
        if k <= 0:
            return Draft.empty()
        found = continuations(seq, k, self.o.max_ngram, self.o.min_ngram, self.o.candidates)
        # the static cache: a chain drafts from it only where the sequence has no match (its own n-grams are the
        # closer evidence); a trie takes its continuation as one more branch, the last (TPF +10% with it: text.md)
        if self.cache is not None and (self.o.candidates > 1 or not found):
            extra = self.cache.draft(seq, k)
            if extra and extra not in found:
                found.append(extra)
        if len(found) > 1:
            return prefix_tree(found, most=TRIE_NODES)[0]
        return Draft.chain(found[0] if found else [])


def lookup(seq: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of seq's n-gram suffix (the longest n first)."""
    return next(iter(continuations(seq, k, max_ngram, min_ngram, 1)), [])


def continuations(seq: list[int], k: int, max_ngram: int, min_ngram: int, count: int) -> list[list[int]]:
    """Up to k tokens after each of the `count` most recent earlier occurrences of seq's longest n-gram suffix that
    occurs earlier (max_ngram down to min_ngram), the newest first. The tokens are searched as 4-byte words by
    `bytes.rfind` (C speed: a Python scan of a long sequence costs a GPU step's time every step), each hit kept only
    at a word boundary."""
    words, end = array("i", seq).tobytes(), 4 * (len(seq) - 1)  # a match ends before the last token: i <= len - n - 1
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix, stop, found = words[-4 * n :], end, []
        while len(found) < count and (j := words.rfind(suffix, 0, stop)) >= 0:
            if j % 4 == 0:
                found.append(seq[j // 4 + n : j // 4 + n + k])
            stop = j + 4 * n - 1  # the matches that start before this hit (one across a word boundary, or the next)
        if found:
            return found
    return []
