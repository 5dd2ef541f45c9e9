"""The batched decode loop every method runs on: numbered steps over the live rows (docs/decoding.md)."""

from __future__ import annotations

import time
from collections import deque
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from specgen.decoding.pool import RowStep, StepPolicy
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.decoding.stops import Stops, stops_of
from specgen.decoding.target import Target, TargetOut
from specgen.devices import now


@dataclass(frozen=True)
class DecodeResult:
    """Generated token ids (prompt excluded) and the run's statistics."""

    tokens: list[int]
    stats: DecodeStats


@dataclass(frozen=True)
class BatchResult:
    """Per-prompt results in input order, and the whole batch's statistics (forwards, phases, wall time)."""

    results: list[DecodeResult]
    stats: DecodeStats


@dataclass
class Row:
    """One sequence in a slot: its prompt, output so far, generator stream and statistics (its drafter: the pool's)."""

    index: int  # position in the input
    prompt: list[int]
    generator: torch.Generator | None
    out: list[int] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    done: bool = False
    streamed: int = 0  # tokens of `out` already given to `on_tokens`
    checked: int = 0  # tokens of `out` looked at for a stop (`Stops.end`)
    stop: int | None = None  # the length of `out` through its first stop, once one is found
    # the batch's phase seconds when the row went live: at its finish the row is charged what the batch's phases
    # added since (it lived through each), one dict merge instead of a charge to every live row in every phase
    since: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """What stays fixed over one `decode_batch` call."""

    params: SamplingParams
    stops: Stops
    max_new_tokens: int
    max_draft: int
    on_done: Callable[[int], None] | None
    on_tokens: Callable[[int, list[int]], None] | None = None  # (prompt index, tokens just emitted) as they come


@torch.no_grad()  # the loop's eager ops too (a commit's moves: kernel_choice.one_pass asks for autograd off)
def decode_batch(
    target: Target,
    policy: StepPolicy,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    stops: Stops | Sequence[int] = (),
    generators: Sequence[torch.Generator | None] | None = None,
    batch_size: int = 0,
    max_draft: int = 256,
    on_done: Callable[[int], None] | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
) -> BatchResult:
    """Decode every prompt, at most `batch_size` (0: all) at a time, under `policy` (drafters: `methods.run_batch`).

    `stops`: where a row ends besides its budget (a sequence: stop ids alone; image and mesh runs give no strings);
    `generators[i]`: prompt i's random stream; `max_draft`: the most draft nodes of a row (sizes the cache);
    `on_done(i)` when prompt i finishes; `on_tokens(i, tokens)` as it emits them (concatenated: its result)."""
    if not prompts:
        return BatchResult([], DecodeStats())
    run = Run(params, stops_of(stops), max_new_tokens, max_draft, on_done, on_tokens)
    batch = Batch(target, policy, prompts, generators, batch_size, run)
    while batch.refill():  # 0. retire finished rows, prefill queued prompts into free slots
        before = batch.total.wall_time  # the host time of the batch's phases so far: a step's is what they add
        steps = batch.plan()  # 1. per live row: what it feeds the forward, or tokens it emits without one
        fed = [i for i, st in enumerate(steps) if st.root is not None]
        if fed:
            out, sizes = batch.verify(steps, fed)  # 2. the target's forward over the rows [fed[0], fed[-1]]
            outcomes = batch.settle(fed, out, sizes)  # 3. per fed row: the nodes to keep and the tokens to emit
            batch.commit(fed, outcomes)  # 4. keep those nodes on every branch row of each sequence
            for i, (_, tokens) in zip(fed, outcomes):
                steps[i].tokens.extend(tokens)
        batch.emit(steps)  # 5. rows emit their tokens; rows that finish leave at the next refill
        batch.policy.end_step(batch.total.wall_time - before)  # 6. the whole step's time, for a measured budget
    return BatchResult(batch.results, batch.total)


class Batch:
    """The state of one `decode_batch` call: the shared cache, the live rows in slots [0, n), the queue, results."""

    def __init__(self, target: Target, policy: StepPolicy, prompts: Sequence[list[int]],
                 generators: Sequence[torch.Generator | None] | None, batch_size: int, run: Run) -> None:
        self.target, self.policy, self.prompts, self.run = target, policy, prompts, run
        self.generators = list(generators) if generators is not None else [None] * len(prompts)
        width = min(batch_size or len(prompts), len(prompts))
        max_len = max(map(len, prompts)) + run.max_new_tokens + max(run.max_draft, policy.max_feed) + 1
        self.cache = target.new_cache(width, max_len)
        policy.open(width, max_len)
        self.queue, self.slots = deque(range(len(prompts))), []
        self.results: list[DecodeResult | None] = [None] * len(prompts)
        self.total, self.t0 = DecodeStats(), now(target.device)  # CUDA: after queued work (devices.now)

    def clock(self, phase: str) -> AbstractContextManager:
        """Charge a block to `phase` of the batch; its live rows take their share at their finish (`Row.since`)."""
        return timed([self.total], phase)

    def admit(self, i: int, slot: int) -> tuple[Row, TargetOut]:
        """Prefill prompt i into `slot` (its own rows of the cache): the row and the prefill's output, unread."""
        row, br = Row(i, list(self.prompts[i]), self.generators[i]), self.target.branches
        with timed([row.stats], "prefill"), self.clock("prefill"):
            rows = self.cache.clear_seq(slot, br)
            view = self.cache.rows(rows.start, rows.stop)
            view.key_mask, view.cross = None, None  # a new sequence: no condition of the slot's previous one
            first = self.target.prefill(torch.tensor([row.prompt]), view)  # on the host (Target.prefill)
            self.cache.absorb(view, rows.start)
        self.total.target_forwards += 1
        row.stats.target_forwards += 1
        return row, first

    def start(self, slot: int, row: Row, first: TargetOut) -> Row:
        """The policy picks the admitted row's first token(s) from its prefill: the prompt's first host read, whose wait
        the batch charges to its prefill (a row charges its policy's part to its propose)."""
        with timed([row.stats], "propose"), self.clock("prefill"):
            self.policy.admit(slot, row.index, row.prompt, first)
            row.out.extend(self.policy.start(slot, first, self.run.params, row.generator, row.stats))
        row.since = dict(self.total.times)  # live from here: the batch's phases from now on are its too
        row.done = self.ends(row, False)
        self.stream(row)
        return row

    def ends(self, row: Row, policy_ends: bool) -> bool:
        """Whether `row` ends after its latest tokens: a stop among them, its budget reached, or its policy says so."""
        # every new token is looked at, not only the last: a multi-token step can accept a stop mid-chunk, and
        # checking only the last would keep decoding (and counting forwards) past the end of the text
        if row.stop is None:
            row.stop = self.run.stops.end(row.out, row.checked, self.run.max_new_tokens)
            row.checked = len(row.out)
        return row.stop is not None or len(row.out) >= self.run.max_new_tokens or policy_ends

    def kept(self, row: Row) -> int:
        """How many of the row's tokens its result keeps: through its first stop and within its budget (a
        multi-token step's tokens past either are dropped)."""
        return min(self.run.max_new_tokens, row.stop or len(row.out))

    def finish(self, row: Row) -> None:
        # the batch's phases since the row went live (none runs between the emit that ended it and here)
        for phase, seconds in self.total.times.items():
            row.stats.times[phase] = row.stats.times.get(phase, 0.0) + seconds - row.since.get(phase, 0.0)
        row.out = row.out[: self.kept(row)]
        row.stats.new_tokens = len(row.out)
        self.total.new_tokens += len(row.out)
        row.stats.extras["latency_s"] = now(self.target.device) - self.t0  # queueing included
        self.total.accepted += row.stats.accepted  # the batch's step records, gathered row by row
        self.total.draft_sizes += row.stats.draft_sizes
        self.total.depths += row.stats.depths
        self.results[row.index] = DecodeResult(row.out, row.stats)
        if self.run.on_done:
            self.run.on_done(row.index)

    def refill(self) -> bool:
        """Retire finished rows, prefill queued prompts into free slots, compact the live rows to [0, n); any left?

        A row can finish in its own prefill, so admission repeats until every slot is live or the queue is empty."""
        slots, queue, br = self.slots, self.queue, self.target.branches
        while True:
            for i, row in enumerate(slots):
                if row is not None and row.done:
                    self.finish(row)
                    slots[i] = None
            holes = [i for i, row in enumerate(slots) if row is None]
            grow = max(0, min(len(queue) - len(holes), self.cache.batch // br - len(slots)))  # new slots, in order
            holes += range(len(slots), len(slots) + grow)
            slots += [None] * grow
            if not holes or not queue:
                break
            # every free slot's prefill first, then their first reads: on a GPU the prefills run back to back, not
            # each behind the host's read of the last
            admitted = [(slot, *self.admit(queue.popleft(), slot)) for slot in holes[: len(queue)]]
            for slot, row, first in admitted:
                slots[slot] = self.start(slot, row, first)
        while None in slots:  # nothing queued: trailing holes go; the last live row moves into the first hole
            src, row = len(slots) - 1, slots.pop()
            if row is not None:
                hole = slots.index(None)
                self.cache.move_seq(src, hole, br)
                self.policy.move(src, hole)
                slots[hole] = row
        return bool(slots)

    def plan(self) -> list[RowStep]:
        rem = [self.run.max_new_tokens - len(r.out) - 1 for r in self.slots]
        return self.policy.plan([r.prompt + r.out for r in self.slots], rem, [r.stats for r in self.slots],
                                [r.generator for r in self.slots], self.run.params, self.clock)

    def verify(self, steps: list[RowStep], fed: list[int]) -> tuple[TargetOut, tuple[int, ...]]:
        """The policy's forward over rows [lo, hi) of the fed span; a row in it that sits out feeds one padding node."""
        feeds = {i: (steps[i].root, steps[i].draft) for i in fed}
        with self.clock("verify"):
            span = self.policy.forward(self.target, self.cache, feeds)
        self.view, sizes = span.view, span.sizes
        self.total.target_forwards += span.forwards
        for i in fed:
            self.slots[i].stats.target_forwards += span.forwards
            self.slots[i].stats.target_tokens += sizes[i - fed[0]]
            self.total.target_tokens += sizes[i - fed[0]]
        return span.out, sizes

    def settle(self, fed: list[int], out: TargetOut, sizes: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
        """The policy's (keep, tokens) per fed row."""
        return self.policy.settle(fed, fed[0], out, sizes, self.run.params, [self.slots[i].generator for i in fed],
                                  [self.slots[i].stats for i in fed], self.clock)

    def commit(self, fed: list[int], outcomes: list[tuple[list[int], list[int]]]) -> None:
        lo, br = fed[0], self.target.branches
        with self.clock("commit"):
            self.view.commit_seqs({i - lo: keep for i, (keep, _) in zip(fed, outcomes)}, br)
            self.cache.absorb(self.view, lo * br)

    def emit(self, steps: list[RowStep]) -> None:
        self.total.steps += 1
        for i, (r, st) in enumerate(zip(self.slots, steps)):
            r.out.extend(st.tokens)
            r.done = self.ends(r, self.policy.finished(i))
            self.stream(r)

    def stream(self, row: Row) -> None:
        """Give `on_tokens` the row's new tokens, cut where its result will be cut (stop, budget)."""
        if self.run.on_tokens is None:
            return
        end = self.kept(row)
        if end > row.streamed:
            self.run.on_tokens(row.index, row.out[row.streamed : end])
            row.streamed = end


@contextmanager
def timed(stats: list[DecodeStats], phase: str) -> Iterator[None]:
    """Add the host time of a block to phase `phase` of every stats object given (no device sync: a step's host reads
    wait anyway, so a step's total stays its wall time)."""
    t0 = time.perf_counter()
    yield
    dt = time.perf_counter() - t0
    for s in stats:
        s.times[phase] = s.times.get(phase, 0.0) + dt

