"""VVS: speculative decoding with partial verification skipping for visual AR models (LOSSY; docs/methods/vvs.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.pool import PolicyBase, RowStep
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut
from specgen.decoding.tree import DraftTree
from specgen.errors import UsageError
from specgen.methods.eagle import EagleBatch, EagleTreeDrafter
from specgen.methods.options import VvsOptions
from specgen.methods.vvs_schedule import DynamicSkip, SkipSchedule, UniformSkip


def after_chain(chain: list[int] | tuple[int, ...], draft: Draft) -> Draft:
    """The draft x° + C: a chain of the unverified tokens with C's tree hanging from its last node."""
    g = len(chain)
    if not g:
        return draft
    parents = tuple(range(-1, g - 1)) + tuple(p + g if p >= 0 else g - 1 for p in draft.tree.parents)
    return Draft(tuple(chain) + draft.tokens, DraftTree(parents))


def sample_path(draft: Draft, generator: torch.Generator) -> list[int]:
    """Eq. 1: a uniformly drawn root-to-leaf path, truncated to min(its length, floor(mean path length))."""
    paths = draft.tree.paths()
    mean_floor = sum(len(p) for p in paths) // len(paths)
    path = paths[int(torch.randint(len(paths), (), generator=generator))]
    return path[: min(len(path), mean_floor)]


class FeatureCache:
    """Token-level target features [B, T, D] by position (Sec. 4.3); positions [0, length) are filled."""

    def __init__(self, first: torch.Tensor, max_len: int) -> None:
        self.buf, self.length = first.new_zeros(first.shape[0], max_len, first.shape[2]), 0
        self.append(first)

    def append(self, feats: torch.Tensor) -> None:
        """Store features [B, n, D] of the next n positions (the committed frontier)."""
        self.buf[:, self.length : self.length + feats.shape[1]] = feats
        self.length += feats.shape[1]

    def recent(self, n: int, staleness: int = 0) -> torch.Tensor:
        """The n most recent features [B, n, D], shifted `staleness` further back (clamped at 0)."""
        idx = [max(0, self.length - n - staleness + j) for j in range(n)]
        return self.buf[:, idx]


@dataclass
class VVS(DrafterBase):
    """One row's VVS parts: its EAGLE drafter, skip schedule and options; `VVSBatch` runs the rows."""

    drafter: EagleTreeDrafter
    schedule: SkipSchedule = field(default_factory=SkipSchedule)
    staleness: int = 0
    refresh: bool = True
    seed: int = 0

    def step_policy(self, make: Callable[[int], "VVS"], target, rule, budget) -> "VVSBatch":
        """VVS's own steps on the shared batched loop (`make(0)` is this row)."""
        return VVSBatch(make, rule, budget)


@dataclass
class VVSRow:
    """One sequence's VVS state in a slot: its decoder (schedule, options), feature cache and path generator."""

    dec: VVS
    feats: FeatureCache
    paths_rng: torch.Generator
    unverified: list[int] = field(default_factory=list)  # x°: tokens of the last (skipped) step
    verified_run: int = 0
    draft: Draft | None = None  # this step's tree C_t


class VVSBatch(PolicyBase):
    """StepPolicy: VVS rows; a row whose schedule skips emits its path and sits out (its state: its own, batch-free)."""

    extras = ("skipped_steps", "unverified_tokens", "post_verified_tokens", "unverified_tail")

    def __init__(self, make: Callable[[int], VVS], rule, budget) -> None:
        self.make, self.rule, self.budget = make, rule, budget
        self.eagle = EagleBatch(lambda index: self._next.drafter, skip_ar_steps=False)
        shape = make(0).drafter.policy.shape(0)
        self.max_feed = shape.total_tokens + shape.depth + 1  # root + x° (<= depth) + C_t

    def open(self, width: int, max_len: int) -> None:
        super().open(width, max_len)
        self.max_len = max_len
        self.eagle.open(width, max_len)

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        dec = self._next = self.make(index)
        self.eagle.admit(slot, index, prompt, first)
        self.rows[slot] = VVSRow(dec, FeatureCache(first.features, self.max_len), None)

    def start(self, slot: int, first: TargetOut, params, generator, stats: DecodeStats) -> list[int]:
        row = self.rows[slot]
        row.paths_rng = generator or torch.Generator().manual_seed(row.dec.seed)
        return super().start(slot, first, params, generator, stats)

    def move(self, src: int, dst: int) -> None:
        super().move(src, dst)
        self.eagle.move(src, dst)

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        n = len(seqs)
        rows = self.rows[:n]
        cap = self.budget.cap(n)
        with clock("propose"):  # 1. propose: every row's tree, one drafter forward per level
            drafts = self.eagle.propose(seqs, [min(cap, b) for b in budgets], stats)
        with clock("schedule"):  # never twice in a row (`may_skip`)
            skips = [row.dec.schedule.decide(d, row.verified_run) for row, d in zip(rows, drafts)]
        steps = []
        for i, (row, d, seq, skip, s) in enumerate(zip(rows, drafts, seqs, skips, stats)):
            row.draft = d
            if skip:  # 3'. accept a path unverified; 5'. the drafter continues from stale features
                with clock("accept"):
                    tokens = [d.tokens[j] for j in sample_path(d, row.paths_rng)]
                self.eagle.rows[i].pending = row.feats.recent(len(tokens), row.dec.staleness)
                row.unverified, row.verified_run = tokens, 0
                s.extras["skipped_steps"] += 1
                s.extras["unverified_tokens"] += len(tokens)
                s.extras["unverified_tail"] = len(tokens)  # stays if the row ends here
                steps.append(RowStep(tokens=list(tokens)))
            else:  # 2. verify root + x° (post-verification) + C_t
                g = len(row.unverified)
                steps.append(RowStep(seq[-1 - g], after_chain(row.unverified, d)))
        return steps

    def settle(self, fed, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        br = out.features.shape[0] // out.logits.shape[0]
        results = []
        for i, gen, s in zip(fed, generators, stats):
            row, j = self.rows[i], i - lo
            d, g = row.draft, len(row.unverified)
            with clock("accept"):  # 3. the rule judges C_t only, on the logits from x°'s last token on
                verdict = self.rule(d, out.logits[j, g : sizes[j]], params, gen)
            keep = verdict.kept(g)
            feats = out.features[j * br : (j + 1) * br, : sizes[j]]
            with clock("propose"):  # 5. fresh features: feature cache, and the drafter's from x°'s last token on
                row.feats.append(feats[:, keep])
                self.eagle.learn(i, feats[:, keep[g:]], verdict)  # never owed: VVS's eagle drafts every step
                if g and row.dec.refresh:  # recompute the drafter's entries of x° from their fresh features
                    cache, drafter = self.eagle.cache, self.eagle.rows[i]
                    for r in range(i * self.eagle.br, (i + 1) * self.eagle.br):
                        cache.rollback(r, cache.lengths[r] - g)
                    drafter.pending = torch.cat([feats[:, :g], drafter.pending], 1)
            s.record(d.size, d.tree.max_depth(), verdict.num_accepted)
            s.extras["post_verified_tokens"] += g
            s.extras["unverified_tail"] = 0
            row.unverified, row.verified_run = [], row.verified_run + 1
            results.append((keep, list(verdict.tokens)))
        return results


def build_vvs(drafter: EagleTreeDrafter, codebook: torch.Tensor | None, o: VvsOptions) -> VVS:
    """A row's VVS from its options (checked by `VvsOptions`: schedule, interval >= 2, threshold, alpha, stride)."""
    schedules: dict[str, Callable[[], SkipSchedule]] = {
        "uniform": lambda: UniformSkip(o.interval),
        "dynamic": lambda: DynamicSkip(codebook, o.threshold, o.alpha, o.stride),
        "none": SkipSchedule,
    }
    if o.schedule == "dynamic" and codebook is None:
        raise UsageError("vvs schedule=dynamic needs the target's VQ codebook")
    return VVS(drafter, schedules[o.schedule](), staleness=o.staleness, refresh=o.refresh, seed=o.seed)
