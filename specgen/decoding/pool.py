"""What one step of the batched loop talks to: the Drafter, DrafterPool and StepPolicy protocols, their no-op base."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Protocol, Sequence

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import pick
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import Target, TargetOut
from specgen.decoding.verify import Span, forward_span
from specgen.models.cache import KVCache

Clock = Callable[[str], AbstractContextManager]  # clock(phase): charge a block's wall time to `phase`


class Drafter(Protocol):
    """Proposes drafts for one row and re-synchronises after each verdict."""

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        """Start a new sequence; `first` is the prefill output."""

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        """A draft of at most `budget` nodes (depth) following `seq` (prompt + generated)."""

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        """Learn the outcome; `out` is this row's slice of the verify forward (input 0 = root)."""

    def finished(self) -> bool:
        """Whether the row ends now (e.g. block Jacobi after a block with a stop token)."""


class Slots(Protocol):
    """What the loop asks of whatever holds per-slot state (pools and policies)."""

    max_feed: int  # most nodes one row feeds a forward beyond the draft budget (sizes the cache)

    def open(self, width: int, max_len: int) -> None:
        """Before the first admission: at most `width` slots, sequences of at most `max_len` positions."""

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        """Prompt `index` starts in `slot`; `first` is its prefill output."""

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s sequence continues in slot `dst`."""

    def finished(self, slot: int) -> bool:
        """Asked after each step: the row in `slot` ends now."""


class DrafterPool(Slots, Protocol):
    """Drafts for the live slots [0, n) of a batch."""

    def propose(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats]) -> list[Draft]:
        """One draft per live slot, in slot order."""

    def on_accept(self, drafts: Sequence[Draft], verdicts: Sequence[Verdict], out: TargetOut,
                  sizes: Sequence[int], branches: int) -> None:
        """Learn every live slot's outcome from the batched verify forward `out` (slot i: its first sizes[i] inputs)."""

    def drafted(self) -> Sequence[int]:
        """The drafter-model forwards of the step since the last `propose`, each its rows x tokens (none: no drafter
        model ran; an untimed budget costs them: `DraftBudget.observe_drafter`)."""


@dataclass
class RowStep:
    """One row's part of a step: it feeds `root` + `draft` (a tree from root) as a verify does, or sits out the forward
    (`root` None); `tokens` are emitted without a forward (VVS skips), before `settle`'s."""

    root: int | None = None
    draft: Draft = field(default_factory=Draft.empty)
    tokens: list[int] = field(default_factory=list)


class StepPolicy(Slots, Protocol):
    """A method's step over the live slots: the loop prefills, runs the step's forward, commits and counts;
    `clock(phase)` charges a block to `phase` of every live row and the batch (the policy times all but verify and
    commit)."""

    def start(self, slot: int, first: TargetOut, params, generator: torch.Generator | None,
              stats: DecodeStats) -> list[int]:
        """The first output tokens of the sequence just admitted to `slot` (after `admit`); may be none."""

    def plan(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats],
             generators: Sequence[torch.Generator | None], params, clock: Clock) -> list[RowStep]:
        """1. One RowStep per live slot; budgets[i] = tokens slot i may still add beyond one."""

    def forward(self, target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
        """2. The target's work on the fed rows (sequence -> root, draft): one forward (`forward_span`), or more."""

    def settle(self, rows: Sequence[int], lo: int, out: TargetOut, sizes: Sequence[int], params,
               generators: Sequence[torch.Generator | None], stats: Sequence[DecodeStats],
               clock: Clock) -> list[tuple[list[int], list[int]]]:
        """3. (keep, tokens) per fed slot in `rows`: fed node indices to commit (ascending) and tokens to emit.

        Slot rows[j] is row rows[j] - lo of the forward `out` (logits [., S, V], features per CFG branch);
        its first sizes[rows[j] - lo] inputs are real."""

    def end_step(self, seconds: float) -> None:
        """6. The whole step's wall time (a measured draft budget learns from it)."""


class PoolBase:
    """No-op defaults of `Slots` and `StepPolicy` capabilities, and the per-slot state that moves with a sequence:
    `rows[slot]` and, in a pool with a cache of its own (a drafter's), that cache's `br` rows per slot."""

    max_feed = 0
    cache: KVCache | None = None
    br = 1

    def open(self, width: int, max_len: int) -> None:
        self.rows: list = [None] * width

    def move(self, src: int, dst: int) -> None:
        self.rows[dst], self.rows[src] = self.rows[src], None
        if self.cache is not None:
            self.cache.move_seq(src, dst, self.br)

    def finished(self, slot: int) -> bool:
        return False

    def end_step(self, seconds: float) -> None:
        pass

    def drafted(self) -> Sequence[int]:
        return ()  # per-row drafters draft without a model forward (n-gram, Jacobi guesses, AR's empty draft)


class PolicyBase(PoolBase):
    """Base of StepPolicies (`decode_batch` runs them as given): by default the prefill picks token 0, and a row's
    `extras` (the method's counters) start at 0."""

    extras: tuple[str, ...] = ()
    forward = staticmethod(forward_span)

    def start(self, slot: int, first: TargetOut, params, generator, stats: DecodeStats) -> list[int]:
        stats.extras.update(dict.fromkeys(self.extras, 0))
        return [pick(first.logits[0, -1], params, generator)]


class EachRow(PoolBase):
    """The pool of per-row Drafters: `make(index)` builds prompt index's drafter; each drafts in turn (`max_feed`: the
    most nodes of their drafts, where more than the loop's draft cap)."""

    def __init__(self, make: Callable[[int], Drafter], max_feed: int = 0) -> None:
        self.make, self.max_feed = make, max_feed

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        self.rows[slot] = self.make(index)
        self.rows[slot].reset(prompt, first)

    def propose(self, seqs, budgets, stats) -> list[Draft]:
        return [d.propose(seq, b, s) for d, seq, b, s in zip(self.rows, seqs, budgets, stats)]

    def on_accept(self, drafts, verdicts, out, sizes, branches) -> None:
        whole = len(drafts) == 1 and out.logits.shape[:2] == (1, sizes[0])  # one row, unpadded: no slices (host ops)
        for i, (draft, verdict, s) in enumerate(zip(drafts, verdicts, sizes)):
            self.rows[i].on_accept(draft, verdict, out if whole else RowOut(out, i, s, branches))

    def finished(self, slot: int) -> bool:
        return self.rows[slot].finished()


@dataclass(frozen=True)
class RowOut:
    """Row i of a batch forward's TargetOut, padding dropped: its `size` nodes on its `branches` feature rows. A
    drafter reads it as a TargetOut; each tensor view is made on its first read (a view is a host op, a few µs of a
    GPU host's step, and most drafters read none: the n-gram's)."""

    out: TargetOut
    i: int
    size: int
    branches: int

    @cached_property
    def logits(self) -> torch.Tensor:  # [1, S, V]
        return self.out.logits[self.i : self.i + 1, : self.size]

    @cached_property
    def features(self) -> torch.Tensor:  # [br, S, D]
        return self.out.features[self.i * self.branches : (self.i + 1) * self.branches, : self.size]

    @cached_property
    def argmax(self) -> list[list[int]] | None:  # [1][S] where the step read its picks
        return None if self.out.argmax is None else [self.out.argmax[self.i][: self.size]]

    picks = TargetOut.picks  # its logits or argmax: TargetOut's rule
