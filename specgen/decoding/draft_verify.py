"""Draft-verify as a step policy (a pool proposes, a forward verifies, a rule judges), and the drafter base."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol, Sequence

import torch

from specgen.decoding.accept import accept_greedy, accept_sampled
from specgen.decoding.budget import DraftBudget
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.pool import DrafterPool, EachRow, PolicyBase, RowStep, StepPolicy
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import TargetOut

Rule = Callable[[Draft, torch.Tensor, SamplingParams, "torch.Generator | None"], Verdict]


def judge(draft: Draft, logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
    """Lossless acceptance of one draft (logits [S, V]): greedy match at temperature 0, tree rejection sampling
    otherwise (a `judge_batch` row's verdict)."""
    if params.greedy:
        return accept_greedy(draft, logits.argmax(-1).tolist())
    return accept_sampled([draft], logits[None], params, [generator])[0]


def judge_batch(drafts: Sequence[Draft], out: TargetOut, sizes: Sequence[int], params: SamplingParams,
                generators: Sequence[torch.Generator | None]) -> list[Verdict]:
    """`judge` for every row of a verify forward (out.logits [n, S, V]) with one device-to-host copy of a few ints a
    row (greedy: the picks, `out.argmax` where the caller read them; sampled: `accept_sampled`, replayed in the
    target's `out.graphs`)."""
    if params.greedy:
        argmax = out.picks()  # [n][S]
        return [accept_greedy(d, argmax[i][: sizes[i]]) for i, d in enumerate(drafts)]
    return accept_sampled(drafts, out.logits, params, generators, out.graphs)


class ReadAlong(Protocol):
    """A pool whose device work on every verify position rides the forward (the target's post-step: its
    `TargetOut.ahead`, a pool's next candidates for each length the verdict may accept, after the greedy picks) and
    the greedy judge's one host copy, so that the next step needs no read of its own."""

    def take(self, host: list[list[list[float]]]) -> None:
        """The host copy [n][S][k] of the columns (`ahead` without its picks), before the verdicts are judged."""


class DraftVerify(PolicyBase):
    """The draft-verify step over a DrafterPool: every live row feeds its last token + its draft every step;
    `along`: device work read with the greedy judge's picks (`ReadAlong`)."""

    def __init__(self, pool: DrafterPool, rule: Rule, budget: DraftBudget, along: ReadAlong | None = None) -> None:
        self.pool, self.rule, self.budget, self.along = pool, rule, budget, along
        self.max_feed = pool.max_feed
        self.drafts: list[Draft] = []
        # the pool holds the per-slot state: its own `Slots` methods serve the loop
        self.open, self.admit, self.move, self.finished = pool.open, pool.admit, pool.move, pool.finished
        self.end_step = budget.observe_step  # the loop's whole step time feeds a measured budget

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        cap = self.budget.cap(len(seqs))
        with clock("propose"):  # 1. the pool drafts for every live row, within the budget's cap
            return self.propose(seqs, [min(cap, b) for b in budgets], stats)

    def propose(self, seqs, budgets: list[int], stats) -> list[RowStep]:
        """Each live row's step: its last token and the pool's draft."""
        self.drafts = self.pool.propose(seqs, budgets, stats)
        return [RowStep(seq[-1], d) for seq, d in zip(seqs, self.drafts)]

    def settle(self, rows, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        drafts = self.drafts  # every live row fed: rows = [0, n), lo = 0
        with clock("accept"):  # 3. per row, each with its own generator stream
            if self.rule is judge:  # one device-to-host copy for the whole batch, not one per row
                if params.greedy:  # kept on `out`: a drafter's next guesses are the same argmax (no second read)
                    out = replace(out, argmax=self.picks(out))
                verdicts = judge_batch(drafts, out, sizes, params, generators)
            else:
                verdicts = [self.rule(d, out.logits[i, : sizes[i]], params, g)
                            for i, (d, g) in enumerate(zip(drafts, generators))]
        with clock("propose"):  # 5. the pool learns the verdicts
            self.pool.on_accept(drafts, verdicts, out, sizes, out.features.shape[0] // out.logits.shape[0])
            for s, d, v in zip(stats, drafts, verdicts):
                depth = d.tree.max_depth()
                s.record(d.size, depth, v.num_accepted)
                self.budget.observe(d.size, depth, v.num_accepted)
            self.budget.observe_drafter(self.pool.drafted())
        return [(v.kept(), list(v.tokens)) for v in verdicts]

    def picks(self, out: TargetOut) -> list[list[int]]:
        """The greedy picks [n][S] on the host, with `along`'s columns (`out.ahead`) in the same device-to-host copy."""
        if self.along is None or out.argmax is not None:
            return out.picks()
        host = out.ahead.tolist()  # [n][S][1 + k]: float32 holds every token id exactly (vocabularies < 2^24)
        self.along.take([[col[1:] for col in row] for row in host])
        return [[int(col[0]) for col in row] for row in host]


class DrafterBase:
    """Base of drafters (and of method objects with their own steps): no-op capabilities, and the policy of its rows."""

    max_feed = 0  # the most nodes of a draft where more than the loop's draft cap, a cap on its depth (sizes the cache)

    def reset(self, prompt: list[int], first) -> None:
        pass

    def on_accept(self, draft: Draft, verdict: Verdict, out) -> None:
        pass

    def finished(self) -> bool:
        return False

    def step_policy(self, make: Callable[[int], "DrafterBase"], target, rule: Rule, budget: DraftBudget) -> StepPolicy:
        """The step policy that runs the rows `make(index)` builds (this drafter is make(0)): draft-verify over one
        drafter per row, each in turn."""
        return DraftVerify(EachRow(make, self.max_feed), rule, budget)
