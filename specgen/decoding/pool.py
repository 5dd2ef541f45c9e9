"""Drafters of a batch: the loop talks to one `DrafterPool` that drafts for every live slot at once.

`EachRow` is the pool of any per-row `Drafter` (one object per slot, called in turn). A method whose
drafter runs a network (EAGLE) provides a pool of its own that runs one drafter forward per tree level
over every live row (`methods/eagle_batch.py`). Slots are the loop's: live rows occupy [0, n) and the
loop moves the last row into a freed slot, telling the pool with `move`.

A `StepPolicy` is a pool that keeps a method's own step logic on the shared loop (VVS, MuLo-SD): instead
of `propose`/`on_accept` it answers `plan` (per row: what to feed the shared forward, or tokens to emit
without one) and `settle` (per fed row: which fed nodes to keep in the cache, which tokens to emit).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut


class Drafter(Protocol):
    """Proposes drafts for one row and re-synchronises after each verdict."""

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        """Start a new sequence; `first` is the prefill output."""
        ...

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        """A draft of at most `budget` nodes (depth) following `seq` (prompt + generated)."""
        ...

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        """Learn the outcome; `out` is this row's slice of the verify forward (input 0 = root)."""
        ...


class DrafterPool(Protocol):
    """Drafts for the live slots [0, n) of a batch."""

    def open(self, width: int, max_len: int) -> None:
        """Before the first admission: at most `width` slots, sequences of at most `max_len` positions."""
        ...

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        """Prompt `index` starts in `slot`; `first` is its prefill output."""
        ...

    def propose(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats]) -> list[Draft]:
        """One draft per live slot, in slot order."""
        ...

    def on_accept(self, drafts: Sequence[Draft], verdicts: Sequence[Verdict], out: TargetOut,
                  sizes: Sequence[int], branches: int) -> None:
        """Learn every live slot's outcome from the batched verify forward `out` (slot i: its first sizes[i] inputs)."""
        ...

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s sequence continues in slot `dst`."""
        ...

    # optional: `finished(slot) -> bool`, asked after each step, ends a row early (its drafter says it is done)


@dataclass
class RowStep:
    """One row's part of a step under a StepPolicy.

    `root` is None: the row sits out the forward this step (no logits, nothing committed to the cache).
    Otherwise the row feeds `root` then `draft` (a tree hanging from root) at its cache length, exactly as a
    verify does; `settle` then says what to keep. `tokens` are emitted now, without a forward (VVS skipped
    steps); `settle`'s tokens are appended to them.
    """

    root: int | None = None
    draft: Draft = field(default_factory=Draft.empty)
    tokens: list[int] = field(default_factory=list)


class StepPolicy(DrafterPool, Protocol):
    """A DrafterPool whose rows follow the method's own step logic (hooks of `loop.decode_batch`).

    `clock(phase)` is a context manager that charges the block's wall time to `phase` of every live row and
    of the batch; the loop times the forward ("verify") and the commits itself, the policy everything else.
    Optional: `max_feed` (most nodes one row feeds: sizes the cache) and `finished(slot)` (end a row).
    """

    def start(self, slot: int, first: TargetOut, params, generator: torch.Generator | None,
              stats: DecodeStats) -> list[int]:
        """The first output tokens of the sequence just admitted to `slot` (after `admit`); may be none."""
        ...

    def plan(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats],
             generators: Sequence[torch.Generator | None], params,
             clock: Callable[[str], AbstractContextManager]) -> list[RowStep]:
        """One RowStep per live slot; budgets[i] = tokens slot i may still add beyond one."""
        ...

    def settle(self, rows: Sequence[int], lo: int, out: TargetOut, sizes: Sequence[int], params,
               generators: Sequence[torch.Generator | None], stats: Sequence[DecodeStats],
               clock: Callable[[str], AbstractContextManager]) -> list[tuple[list[int], list[int]]]:
        """(keep, tokens) per fed slot in `rows`: fed node indices to commit (ascending) and tokens to emit.

        Slot rows[j] is row rows[j] - lo of the forward `out` (logits [., S, V], features per CFG branch);
        its first sizes[rows[j] - lo] inputs are real."""
        ...


def row_out(out: TargetOut, i: int, size: int, branches: int) -> TargetOut:
    """Row i's slice of a batched forward: logits [1, S_i, V], features [branches, S_i, D] (padding dropped)."""
    return TargetOut(out.logits[i : i + 1, :size], out.features[i * branches : (i + 1) * branches, :size])


class EachRow:
    """The pool of per-row Drafters: `make(index)` builds prompt index's drafter; each drafts in turn."""

    def __init__(self, make: Callable[[int], Drafter]) -> None:
        self.make = make
        self.slots: list[Drafter | None] = []

    def open(self, width: int, max_len: int) -> None:
        self.slots = [None] * width

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        drafter = self.make(index)
        drafter.reset(prompt, first)
        self.slots[slot] = drafter

    def propose(self, seqs, budgets, stats) -> list[Draft]:
        return [d.propose(seq, b, s) for d, seq, b, s in zip(self.slots, seqs, budgets, stats)]

    def on_accept(self, drafts, verdicts, out, sizes, branches) -> None:
        for i, (draft, verdict) in enumerate(zip(drafts, verdicts)):
            self.slots[i].on_accept(draft, verdict, row_out(out, i, sizes[i], branches))

    def move(self, src: int, dst: int) -> None:
        self.slots[dst], self.slots[src] = self.slots[src], None

    def finished(self, slot: int) -> bool:
        """A Drafter with `finished()` may end its row (e.g. block Jacobi after a block with a stop token)."""
        done = getattr(self.slots[slot], "finished", None)
        return bool(done and done())
