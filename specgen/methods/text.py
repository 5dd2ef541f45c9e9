"""Text drafters on the shared loop: AR (empty draft), Jacobi fixed-point guesses, n-gram prompt lookup (and a
static n-gram cache)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut
from specgen.methods.ngram_cache import NgramCache


class EmptyDrafter(DrafterBase):
    """Autoregressive decoding: every step verifies only the root, so it commits exactly one token."""

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        pass

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        return Draft.empty()

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        pass


@dataclass
class JacobiDrafter(DrafterBase):
    """Jacobi decoding as draft-and-verify: the draft is the previous iteration's guesses (root + n - 1 guesses).
    
    A guess is only committed if it equals the target's argmax, so greedy output equals AR; freed slots are refilled
    from the prompt (seeded), as CLLM initialises its guesses.
    """

    block_size: int = 4  # CPU default (methods/options.py: JacobiOptions, tested equal)
    seed: int = 0

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        self.rng = random.Random(self.seed)
        self.pool = list(prompt)
        self.guesses: list[int] = []

    def fill(self, guesses: list[int], n: int) -> list[int]:
        return guesses[:n] + [self.rng.choice(self.pool) for _ in range(n - len(guesses))]

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        n = min(self.block_size - 1, budget)
        self.guesses = self.fill(self.guesses, max(n, 0))
        return Draft.chain(self.guesses)

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        argmax = out.logits[0].argmax(-1).tolist()  # [N + 1]: the next Jacobi iterate
        self.guesses = argmax[verdict.num_accepted + 1 :]


@dataclass
class NgramDrafter(DrafterBase):
    """Prompt lookup: match the longest recent n-gram suffix earlier in the sequence and propose what followed.

    Tries n = max_ngram down to min_ngram and takes the most recent earlier occurrence. With a static `cache`
    (methods/ngram_cache.py: the target's own answers to other prompts), a sequence with no earlier match drafts from
    the cache instead. No match at all means an empty draft (a plain AR step, cost 1), so the method never pays for
    hopeless drafts. `num_draft` is small by default because verification is not free on a CPU
    (docs/results/text.md).
    """

    num_draft: int = 4
    max_ngram: int = 3
    min_ngram: int = 2
    cache: NgramCache | None = None

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        pass

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        k = min(self.num_draft, budget)
        if k <= 0:
            return Draft.empty()
        draft = lookup(seq, k, self.max_ngram, self.min_ngram)
        if not draft and self.cache is not None:  # the sequence's own n-grams first: they are the closer evidence
            draft = self.cache.draft(seq, k)
        return Draft.chain(draft)

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        pass


def lookup(seq: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of seq's n-gram suffix."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == suffix:
                return seq[i + n : i + n + k]
    return []
