"""pcLLM multi-block Jacobi decoding with rejection recycling (`pcllm-mr`) as a drafter (docs/methods/pcllm.md)."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from specgen.decoding.draft import Draft, Verdict, prefix_tree
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.stats import DecodeStats
from specgen.methods.options import MultiBlockOptions
from specgen.methods.text import lookup


@dataclass
class MultiBlockDrafter(DrafterBase):
    """pcLLM (MR) as a Drafter: K blocks of n refined at once + rejection-recycling candidates, one prefix tree.
    Recycled n-grams and the lookup branch only add candidates: greedy output equals the model's own greedy AR."""

    o: MultiBlockOptions = field(default_factory=MultiBlockOptions)
    seed: int = 0

    @property
    def max_feed(self) -> int:
        """The most nodes of a draft (its depth is the loop's to cap): the window, K blocks of n at most, `verify`
        recycled n-grams and the lookup branch."""
        o = self.o
        return o.num_blocks * o.block_size + o.verify * (o.ngram or o.block_size - 1) + o.lookup

    def fill(self, k: int) -> list[int]:
        return [self.rng.choice(self.text) for _ in range(k)]

    def reset(self, prompt: list[int], first) -> None:
        """0. the window starts as n - 1 prompt tokens (seeded) after the root, the first generated token."""
        self.rng = random.Random(self.seed)
        self.pool: deque[list[int]] = deque(maxlen=self.o.pool_size)
        self.text = list(prompt)  # committed tokens before the root: the fill source, as in the paper
        # window[k] guesses position root + 1 + k; segs = contiguous blocks over it, segs[0] is the RA block.
        # seg: [length, progress]: RA progress = tokens committed since it became RA; pseudo = frozen prefix.
        self.window, self.segs = self.fill(self.o.block_size - 1), [[self.o.block_size - 1, 0]]
        self.lead = "main"  # the kind of branch ("main", "pool", "lookup") that won the last step

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        """1. the main chain (the window) and recycled n-grams / the lookup branch that continue the root."""
        root, cand_len = seq[-1], self.o.ngram or self.o.block_size - 1
        main = self.window[:budget]
        cands: list[list[int]] = []
        kinds = ["main"]

        def add(c: list[int], kind: str) -> None:  # a new branch only if it could accept more than main
            if c and c != main[: len(c)] and c not in cands:
                cands.append(c)
                kinds.append(kind)

        for entry in reversed(self.pool):
            if len(cands) >= self.o.verify:
                break
            if root in entry[:-1]:
                i = entry.index(root)
                add(entry[i + 1 : i + 1 + min(cand_len, budget)], "pool")
        if self.o.lookup:  # what followed the sequence's n-gram suffix earlier (prompt lookup)
            add(lookup(seq, min(self.o.lookup, budget), 3, 2), "lookup")
        self.branches, self.kinds, self.stats, self.seq = [main] + cands, kinds, stats, seq
        # the last winner's kind leads the tree: a path along the first branch is a prefix of the verify's nodes, whose
        # commit moves no cache slots (a move is a host tensor and four device ops); which branch wins is unchanged
        draft, self.nodes = prefix_tree(self.branches, kinds.index(self.lead) if self.lead in kinds else 0)
        return draft

    def on_accept(self, draft: Draft, verdict: Verdict, out) -> None:
        """5. Jacobi step on the window, recycle the rejected tail, shift, promote, spawn."""
        n, K = self.o.block_size, self.o.num_blocks
        argmax = out.picks()[0]  # [N + 1] over the prefix tree's inputs
        m = verdict.num_accepted
        path = [draft.tokens[i] for i in verdict.path]
        # the earliest branch holding the accepted path
        b = next(i for i, toks in enumerate(self.branches) if toks[:m] == path)
        self.lead = self.kinds[b]
        branches, window, segs = self.branches, self.window, self.segs
        main = branches[0]
        at = self.nodes  # at[b][k]: verify input of branch b's prefix of length k (0 = the root)
        pred = {k: argmax[at[0][k]] for k in range(len(main) + 1)}  # pred[k]: new guess for window slot k
        if b:
            self.stats.extras["recycled_tokens"] = self.stats.extras.get("recycled_tokens", 0.0) + m
            pred.update({k: argmax[at[b][k]] for k in range(1, len(branches[b]) + 1)})
        if b == 0 and m < len(main) and self.o.pool_size:  # recycle the rejected draft tail
            self.pool.append(list(window[m:]))
        self.text = self.seq + path  # everything before the new root
        start = segs[0][0]
        for seg in segs[1:]:  # pseudo blocks: frozen prefix kept, the rest Jacobi-updated
            k = seg[1]
            while k < seg[0] and start + k in pred and window[start + k] == pred[start + k]:
                k += 1
            seg[1] = k
            for j in range(start, start + seg[0]):
                if j - start >= seg[1] and j in pred:
                    window[j] = pred[j]
            start += seg[0]
        for j in range(min(segs[0][0], len(window))):
            if j in pred:
                window[j] = pred[j]
        if len(segs) == 1 and len(main) == len(window):  # keep the prediction past the window's end
            window.append(pred[len(main)])
            segs[0][0] += 1
        shift = m + 1
        window = window[shift:]
        segs[0][1] += shift
        while shift:  # drop committed slots; a consumed RA promotes the next block
            take = min(shift, segs[0][0])
            segs[0][0] -= take
            shift -= take
            if segs[0][0] == 0 and len(segs) > 1:
                segs.pop(0)
                segs[0][1] = 0  # promoted: verified again behind a clean context
            elif shift:
                break
        if len(segs) == 1 and segs[0][0] < n - 1:  # RA alone: refill its running window
            window = window[: segs[0][0]] + self.fill(n - 1 - segs[0][0])
            segs[0][0] = n - 1
        # 14. spawn a pseudo block: clone the RA draft, pad to n
        if len(segs) < K and segs[-1][1] >= math.ceil(self.o.spawn_ratio * n):
            window += (window[: segs[0][0]] + self.fill(n))[:n]
            segs.append([n, 0])
        self.window = window
