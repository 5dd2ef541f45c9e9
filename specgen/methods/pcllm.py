"""pcLLM inference: Jacobi decoding of a distilled model, and multi-block decoding with rejection recycling (MR).

`pcllm` / `cllm` are the shared loop's `JacobiDrafter` run on the distilled model (a running window
of n - 1 guesses); the training made the carried-over guesses good. `pcllm-mr` is the paper's
Algorithm 1 in a loop of its own (numbered like `decoding/loop.py`), on the same primitives:

  window   guesses for the positions after the root (the last correct, uncommitted token): the
           real-active (RA) block's remaining guesses, then up to K - 1 pseudo-active blocks of n.
  1 propose  the main chain (root + window) plus up to `verify` rejection-recycling candidates: n-grams
             from the pool that start with the root token, as sibling branches of the draft tree; with
             `lookup` > 0 (beyond the paper) one more branch: what followed the latest earlier occurrence
             of the sequence's 3- or 2-gram suffix (prompt lookup, `methods/text.py`), up to `lookup` tokens.
  2 verify   one target forward over the tree (tree mask, shared KV prefix).
  3 accept   greedy: the branch with the longest prefix equal to the target's argmax wins; its tokens
             plus the argmax after them are committed. This is the only way a token is committed, so
             greedy output equals the model's own greedy AR token for token.
  4 commit   the winning path's KV is kept (gathered for a candidate branch), the rest dropped.
  5 update   Jacobi update of the window (argmax at the preceding position); pseudo-accepted tokens of
             pseudo blocks (stable under their noisy context) are frozen; rejected tails go into the
             n-gram pool; a pseudo block is spawned when the newest block has >= ceil(r n) accepted
             tokens and fewer than K blocks are active; when the RA block is done the next block is
             promoted (its tokens are verified again, now behind a clean context).

Differences from Jacobi Forcing's reference (documented in README): candidates are verified as tree
branches in the same forward instead of extra batch rows, and the pool holds rejected RA tails. The
lookup branch is specgen's (off by default): like the recycled n-grams it only adds candidates, so
greedy output still equals the model's own greedy AR.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.loop import DecodeResult, hit_stop, truncate, verify_inputs
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.decoding.tree import DraftTree
from specgen.errors import UsageError
from specgen.methods.text import lookup

MR_OPTIONS = ("block_size", "num_blocks", "spawn_ratio", "pool_size", "verify", "ngram", "lookup")
JACOBI_OPTIONS = ("block_size",)


def longest_branch(branches: list[list[int]], offsets: list[int], argmax: list[int]) -> tuple[int, int]:
    """(branch index, accepted count) of the branch with the longest greedy-correct prefix.

    Branch b's node k is verify input offsets[b] + k + 1; its token must equal the argmax at its
    parent (the root for k = 0, else node k - 1). Ties keep the earlier branch (the main chain).
    """
    best, best_len = 0, -1
    for b, (toks, off) in enumerate(zip(branches, offsets)):
        m, prev = 0, 0
        while m < len(toks) and toks[m] == argmax[prev]:
            prev = off + m + 1
            m += 1
        if m > best_len:
            best, best_len = b, m
    return best, best_len


@dataclass
class MultiBlockDecoder:
    """pcLLM (MR): K blocks of n refined at once + rejection-recycling candidates; greedy and lossless."""

    block_size: int = 4  # n (CPU default: measured fastest, README; paper 64 in recipes/full)
    num_blocks: int = 2  # K (real-active + pseudo-active)
    spawn_ratio: float = 0.85  # r: spawn when the newest block has ceil(r n) accepted tokens
    pool_size: int = 4  # n-gram pool entries (deque)
    verify: int = 1  # recycling candidates verified per step (tree branches)
    ngram: int = 0  # candidate length (0 = n - 1)
    lookup: int = 0  # prompt-lookup branch of up to this many tokens (0 = off, the paper; specgen extension)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 2 or self.num_blocks < 1 or not 0 < self.spawn_ratio <= 1 or self.pool_size < 0 \
                or self.verify < 0 or self.ngram < 0 or self.lookup < 0:
            raise UsageError("pcllm-mr needs block_size >= 2, num_blocks >= 1, 0 < spawn_ratio <= 1, "
                             "pool_size, verify, ngram, lookup >= 0")

    def decode(self, target, prompt: list[int], max_new_tokens: int, params: SamplingParams,
               stop_ids: tuple[int, ...] = (), generator=None, max_draft: int = 256, rule=None) -> DecodeResult:
        if not params.greedy:
            raise UsageError("pcllm-mr is greedy only (temperature 0); use pcllm for sampling")
        n, K = self.block_size, self.num_blocks
        cand_len = self.ngram or n - 1
        spawn_at = math.ceil(self.spawn_ratio * n)
        stats = DecodeStats()
        device = getattr(target, "device", "cpu")
        cache = target.new_cache(1, len(prompt) + max_new_tokens + K * n + self.verify * cand_len + 2)
        rng = random.Random(self.seed)
        pool: deque[list[int]] = deque(maxlen=self.pool_size)
        text = list(prompt)

        def fill(k: int) -> list[int]:
            return [rng.choice(text) for _ in range(k)]

        # 0. prefill: the root (last correct, uncommitted token) is the first generated token
        with stats.timed("prefill"):
            first = target.prefill(torch.tensor([prompt], device=device), cache)
            root = int(first.logits[0, -1].argmax())
        stats.target_forwards += 1
        out = [root]
        # window[k] guesses position root + 1 + k; segs = contiguous blocks over it, segs[0] is the RA block.
        # seg: [length, progress]: RA progress = tokens committed since it became RA; pseudo = frozen prefix.
        window, segs = fill(n - 1), [[n - 1, 0]]
        stopped = hit_stop(out, stop_ids)
        while len(out) < max_new_tokens and not stopped:
            budget = max_new_tokens - len(out) - 1  # guesses that can still be committed besides the bonus
            # 1. propose: the main chain and recycled n-grams that continue the root
            with stats.timed("propose"):
                main = window[:budget]
                cands: list[list[int]] = []

                def add(c: list[int]) -> None:  # a new branch only if it could accept more than main
                    if c and c != main[: len(c)] and c not in cands:
                        cands.append(c)

                for entry in reversed(pool):
                    if len(cands) >= self.verify:
                        break
                    if root in entry[:-1]:
                        i = entry.index(root)
                        add(entry[i + 1 : i + 1 + min(cand_len, budget)])
                if self.lookup:  # what followed the sequence's n-gram suffix earlier (prompt lookup)
                    add(lookup(text + [root], min(self.lookup, budget), 3, 2))
                branches = [main] + cands
                parents: list[int] = []
                offsets: list[int] = []
                for toks in branches:
                    offsets.append(len(parents))
                    parents += [-1 if k == 0 else len(parents) + k - 1 for k in range(len(toks))]
                draft = Draft(tuple(t for b in branches for t in b), DraftTree(tuple(parents)))
            # 2. verify: one forward over root + every branch (tree mask)
            with stats.timed("verify"):
                ids, positions, mask = verify_inputs(root, draft, cache.lengths[0], device)
                argmax = target.forward(ids, positions, cache, mask).logits[0].argmax(-1).tolist()
            # 3. accept: the longest greedy-correct branch prefix, then the argmax after it
            with stats.timed("accept"):
                b, m = longest_branch(branches, offsets, argmax)
                bonus = argmax[offsets[b] + m if m else 0]
            # 4. commit root + the accepted nodes of the winning branch
            with stats.timed("commit"):
                cache.commit(0, [0] + [offsets[b] + k + 1 for k in range(m)])
            stats.record_step(draft.size, max(map(len, branches)), m)
            accepted = branches[b][:m]
            text += [root] + accepted
            out += accepted + [bonus]
            stopped = hit_stop(accepted + [bonus], stop_ids)
            if b:
                stats.extras["recycled_tokens"] = stats.extras.get("recycled_tokens", 0.0) + m
            # 5. update: Jacobi step on the window, recycle the rejected tail, shift, promote, spawn
            with stats.timed("propose"):
                pred = {k: argmax[k] for k in range(len(main) + 1)}  # pred[k]: new guess for window slot k
                if b:
                    pred.update({k: argmax[offsets[b] + k] for k in range(1, len(branches[b]) + 1)})
                if b == 0 and m < len(main) and self.pool_size:  # recycle the rejected draft tail
                    pool.append(list(window[m:]))
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
                    grow = n - 1 - segs[0][0]
                    window = window[: segs[0][0]] + fill(grow)
                    segs[0][0] = n - 1
                # 14. spawn a pseudo block: clone the RA draft, pad to n
                if len(segs) < K and segs[-1][1] >= spawn_at:
                    window += (window[: segs[0][0]] + fill(n))[:n]
                    segs.append([n, 0])
            root = bonus
        out = truncate(out, max_new_tokens, stop_ids)
        stats.new_tokens = len(out)
        return DecodeResult(out, stats)
