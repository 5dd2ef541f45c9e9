"""The decode loop shared by every draft-and-verify method (AR is the empty draft), over a batch of rows.

`decode_batch` decodes many prompts together, each in a slot of one static KV cache: every step
1 proposes a draft per live row -> 2 verifies all of them in one target forward (drafts padded to the
longest, per-row masks, positions and cache lengths; `verify.py`) -> 3 accepts per row (a pure rule,
the row's own generator) -> 4 commits each row's accepted path -> 5 updates each row's drafter. A row
that emits a stop token or reaches its budget leaves at once (it consumes no further forwards) and a
queued prompt is prefilled into its slot (continuous batching); with nothing queued, the last live row
moves into the hole so that live rows stay the contiguous slots [0, n_live) every forward runs over.

Invariants: a row's tokens depend only on its prompt, its drafter and its generator, never on which
rows share its batch (rows only share the forward, whose per-row outputs are computed under per-row
masks); outputs are returned in input order whatever order rows finish in. `decode` is one prompt.

Methods whose control flow differs (VVS skips verifications, MuLo-SD re-samples rejected positions with
extra forwards) run on the same loop through a `StepPolicy` (`pool.py`): a pool with `plan`/`settle`
hooks that says, per row and step, what the row feeds the shared forward (or that it sits out and
commits tokens without one), and turns the row's logits into the cache slots to keep and the tokens to
emit. Prefill, the batched forward, per-row commits, statistics, stop/budget truncation and continuous
batching stay the loop's; a pool without `plan` takes the unchanged draft-verify-accept path.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from specgen.decoding.accept import accept_greedy, accept_rejection
from specgen.decoding.budget import DraftBudget, FixedBudget
from specgen.decoding.cache import KVCache
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.pool import (Drafter, DrafterPool, EachRow, RowStep, StepPolicy,  # noqa: F401 (re-exported)
                                   row_out)
from specgen.decoding.sampling import SamplingParams, logits_to_probs, pick
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import Target
from specgen.decoding.verify import verify_batch
from specgen.devices import now

Rule = Callable[[Draft, torch.Tensor, SamplingParams, "torch.Generator | None"], Verdict]


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


def verify_inputs(root: int, draft: Draft, start: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [1, N+1], positions [1, N+1] and ancestor mask [N+1, N+1] for root + draft (one row)."""
    tokens = torch.tensor([(root,) + draft.tokens], device=device)
    positions = (start + draft.tree.offsets()).unsqueeze(0).to(device)
    return tokens, positions, draft.tree.mask().to(device)


def judge(draft: Draft, logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
    """Lossless acceptance: greedy match at temperature 0, tree rejection sampling otherwise.

    Rejection sampling reads p and q one node at a time, so both move to the generator's device (the host, for the
    seeded CPU streams) in one copy each first: on a GPU each read of a device value would make the host wait."""
    if params.greedy:
        return accept_greedy(draft, logits.argmax(-1).tolist())
    host = generator.device if generator is not None else torch.device("cpu")
    return accept_rejection(probs_on(draft, host), logits_to_probs(logits, params).to(host), generator)


def probs_on(draft: Draft, host: torch.device) -> Draft:
    """`draft` with its q (if any) on the device the rejection rule reads it from."""
    return draft if draft.probs is None or draft.probs.device == host else replace(draft, probs=draft.probs.to(host))


def judge_batch(drafts: Sequence[Draft], logits: torch.Tensor, sizes: Sequence[int], params: SamplingParams,
                generators: Sequence[torch.Generator | None]) -> list[Verdict]:
    """`judge` for every row of a verify forward (logits [n, S, V]) with one device-to-host copy of its reads.

    Greedy reads the argmax [n, S]; sampling the filtered p [n, S, V] (a softmax per position: each row's p is the
    one `judge` computes from its own slice, bit for bit). On a GPU a copy per row made the host wait per row."""
    if params.greedy:
        argmax = logits.argmax(-1).tolist()  # [n][S]
        return [accept_greedy(d, argmax[i][: sizes[i]]) for i, d in enumerate(drafts)]
    hosts = {g.device if g is not None else torch.device("cpu") for g in generators}
    if len(hosts) > 1:  # rows drawing on different devices: each row's own copy
        return [judge(d, logits[i, : sizes[i]], params, g) for i, (d, g) in enumerate(zip(drafts, generators))]
    host = hosts.pop()
    probs = logits_to_probs(logits, params).to(host)  # [n, S, V]
    return [accept_rejection(probs_on(d, host), probs[i, : sizes[i]], g)
            for i, (d, g) in enumerate(zip(drafts, generators))]


def decode(
    target: Target,
    drafter: Drafter,
    prompt: list[int],
    max_new_tokens: int,
    params: SamplingParams,
    stop_ids: tuple[int, ...] = (),
    generator: torch.Generator | None = None,
    max_draft: int = 256,
    rule: Rule | None = None,
) -> DecodeResult:
    """Generate up to `max_new_tokens` after one `prompt`, stopping after any of `stop_ids` (a batch of one).

    `rule` is the accept rule (default `judge`: lossless); relaxed methods pass their own.
    """
    batch = decode_batch(target, lambda i: drafter, [prompt], max_new_tokens, params, stop_ids, [generator],
                         max_draft=max_draft, rule=rule)
    return batch.results[0]


def decode_batch(
    target: Target,
    make_drafter: Callable[[int], Drafter] | DrafterPool,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    stop_ids: tuple[int, ...] = (),
    generators: Sequence[torch.Generator | None] | None = None,
    batch_size: int = 0,
    max_draft: int = 256,
    rule: Rule | None = None,
    budget: DraftBudget | None = None,
    on_done: Callable[[int], None] | None = None,
) -> BatchResult:
    """Decode every prompt, at most `batch_size` (0: all) at a time; `make_drafter(i)` builds prompt i's drafter
    (or `make_drafter` is a `DrafterPool` that drafts for all live rows at once).

    `generators[i]` is prompt i's random stream (sampling stays lossless per row); `budget` caps draft
    sizes by the number of live rows (default: `max_draft`); `on_done(i)` is called when prompt i finishes.
    """
    if not prompts:
        return BatchResult([], DecodeStats())
    rule, budget = rule or judge, budget or FixedBudget(max_draft)
    generators = list(generators) if generators is not None else [None] * len(prompts)
    width = min(batch_size or len(prompts), len(prompts))
    branches = getattr(target, "branches", 1)  # cache rows per sequence (CFG: cond + uncond)
    device = getattr(target, "device", "cpu")
    pool = make_drafter if hasattr(make_drafter, "admit") else EachRow(make_drafter)
    stepper = hasattr(pool, "plan")  # a StepPolicy: the method's own step logic through the hooks below
    max_len = max(map(len, prompts)) + max_new_tokens + max(max_draft, getattr(pool, "max_feed", 0)) + 1
    cache = target.new_cache(width, max_len)
    pool.open(width, max_len)
    queue, slots, results = deque(range(len(prompts))), [], [None] * len(prompts)
    total, t0 = DecodeStats(), now(device)  # CUDA: after queued work (devices.now)

    def admit(i: int, slot: int) -> Row:
        """0. prefill prompt i into `slot` (its own rows of the cache) and pick its first token."""
        row = Row(i, list(prompts[i]), generators[i])
        with timed([total, row.stats, *live()], "prefill"):
            rows = range(slot * branches, (slot + 1) * branches)
            for r in rows:
                cache.rollback(r, 0)
            view = cache.rows(rows.start, rows.stop)
            view.key_mask, view.cross = None, None  # a new sequence: no condition of the slot's previous one
            first = target.prefill(torch.tensor([row.prompt], device=device), view)
            cache.absorb(view, rows.start)
            if not stepper:
                row.out.append(pick(first.logits[0, -1], params, row.generator))
        total.target_forwards += 1
        row.stats.target_forwards += 1
        with timed([row.stats], "propose"):
            pool.admit(slot, i, row.prompt, first)
            if stepper:  # the policy picks the first token(s) (MuLo-SD drafts token 0 too)
                row.out.extend(pool.start(slot, first, params, row.generator, row.stats))
        row.done = len(row.out) >= max_new_tokens or hit_stop(row.out, stop_ids)
        return row

    def live() -> list[DecodeStats]:
        return [r.stats for r in slots if r is not None and not r.done]

    def finish(row: Row) -> None:
        row.out = truncate(row.out, max_new_tokens, stop_ids)
        row.stats.new_tokens = len(row.out)
        row.stats.extras["latency_s"] = now(device) - t0  # queueing included
        results[row.index] = DecodeResult(row.out, row.stats)
        if on_done:
            on_done(row.index)

    def policy_step(slots: list[Row], stats: list[DecodeStats]) -> None:
        """One step under a StepPolicy: plan per row -> one forward over the rows that feed -> settle -> commit."""
        clock = lambda phase: timed(stats, phase)  # noqa: E731  (the policy charges its own phases)
        gens = [r.generator for r in slots]
        steps = pool.plan([r.prompt + r.out for r in slots], [min(max_draft, max_new_tokens - len(r.out) - 1) for r in slots],
                          [r.stats for r in slots], gens, params, clock)
        fed = [i for i, st in enumerate(steps) if st.root is not None]
        if fed:  # rows [lo, hi) share the forward; a row in the span that sits out feeds one padding node
            lo, hi = fed[0], fed[-1] + 1
            with timed(stats, "verify"):
                view = cache.rows(lo * branches, hi * branches)
                roots = [steps[i].root if steps[i].root is not None else 0 for i in range(lo, hi)]
                drafts = [steps[i].draft if steps[i].root is not None else Draft.empty() for i in range(lo, hi)]
                batch = verify_batch(roots, drafts, view.lengths[::branches], device)
                out = target.forward(batch.tokens, batch.positions, view, batch.tree_mask)
            total.target_forwards += 1
            for i in fed:
                slots[i].stats.target_forwards += 1
                slots[i].stats.target_tokens += batch.sizes[i - lo]
                total.target_tokens += batch.sizes[i - lo]
            outcomes = pool.settle(fed, lo, out, batch.sizes, params, [gens[i] for i in fed],
                                   [slots[i].stats for i in fed], clock)
            with timed(stats, "commit"):
                for i, (keep, _) in zip(fed, outcomes):
                    for r in range((i - lo) * branches, (i - lo + 1) * branches):
                        view.commit(r, keep)
                cache.absorb(view, lo * branches)
            for i, (_, tokens) in zip(fed, outcomes):
                steps[i].tokens.extend(tokens)
        total.steps += 1
        ended = getattr(pool, "finished", lambda slot: False)
        for i, (r, st) in enumerate(zip(slots, steps)):
            r.out.extend(st.tokens)
            r.done = len(r.out) >= max_new_tokens or hit_stop(st.tokens, stop_ids) or ended(i)

    while queue or slots:
        refill(slots, queue, admit, cache, branches, finish, pool)
        if not slots:
            break
        n = len(slots)
        stats = [total] + [r.stats for r in slots]
        if stepper:
            policy_step(slots, stats)
            continue
        before = sum(total.times.values())  # the step's time: what its phases add to `total` (no further clock)
        with timed(stats, "propose"):  # 1. propose: the pool drafts for every live row
            cap = budget.cap(n)
            drafts = pool.propose([r.prompt + r.out for r in slots],
                                  [min(cap, max_new_tokens - len(r.out) - 1) for r in slots], [r.stats for r in slots])
        with timed(stats, "verify"):  # 2. verify every live row in one forward
            view = cache.rows(0, n * branches)
            batch = verify_batch([r.out[-1] for r in slots], drafts, view.lengths[::branches], device)
            out = target.forward(batch.tokens, batch.positions, view, batch.tree_mask)
        with timed(stats, "accept"):  # 3. accept per row, each with its own generator stream
            if rule is judge:  # one device-to-host copy for the whole batch, not one per row
                verdicts = judge_batch(drafts, out.logits, batch.sizes, params, [r.generator for r in slots])
            else:
                verdicts = [rule(d, out.logits[i, : batch.sizes[i]], params, r.generator)
                            for i, (r, d) in enumerate(zip(slots, drafts))]
        with timed(stats, "commit"):  # 4. commit root + accepted path on every branch row of each sequence
            for i, v in enumerate(verdicts):
                keep = [0] + [j + 1 for j in v.path]
                for r in range(i * branches, (i + 1) * branches):
                    view.commit(r, keep)
            cache.absorb(view, 0)
        total.target_forwards += 1
        total.steps += 1
        with timed(stats, "propose"):  # 5. update the drafters; rows that finished leave
            pool.on_accept(drafts, verdicts, out, batch.sizes, branches)
            ended = getattr(pool, "finished", lambda slot: False)
            for i, (r, d, v) in enumerate(zip(slots, drafts, verdicts)):
                r.stats.record_step(d.size, d.tree.max_depth(), v.num_accepted)
                total.accepted.append(v.num_accepted)
                total.draft_sizes.append(d.size)
                total.depths.append(d.tree.max_depth())
                total.target_tokens += d.size + 1
                budget.observe(d.size, v.num_accepted)
                r.out.extend(v.tokens)
                r.done = len(r.out) >= max_new_tokens or hit_stop(v.tokens, stop_ids) or ended(i)
        budget.observe_step(sum(total.times.values()) - before)  # 6. the whole step's time, for a measured budget
    total.new_tokens = sum(len(r.tokens) for r in results)
    return BatchResult(results, total)


def refill(slots: list[Row], queue: deque, admit, cache: KVCache, branches: int, finish, pool: DrafterPool) -> None:
    """Retire finished rows, prefill queued prompts into free slots, and compact the live rows to [0, n).

    A row can finish in its own prefill (stop token first, or a budget of one), so admission repeats
    until every slot holds a live row or the queue is empty.
    """
    while True:
        for i, row in enumerate(slots):
            if row is not None and row.done:
                finish(row)
                slots[i] = None
        holes = [i for i, row in enumerate(slots) if row is None]
        if not holes and queue and len(slots) < cache.batch // branches:
            holes = [len(slots)]
            slots.append(None)
        if not holes or not queue:
            break
        for i in holes:
            if queue:
                slots[i] = admit(queue.popleft(), i)
    while None in slots:  # nothing queued: move the last live row into the first hole
        while slots and slots[-1] is None:
            slots.pop()
        if None not in slots:
            break
        hole, src = slots.index(None), len(slots) - 1
        for b in range(branches):
            cache.move_row(src * branches + b, hole * branches + b)
        pool.move(src, hole)
        slots[hole] = slots.pop()


class timed:
    """Add the host time of a block to phase `phase` of every stats object given (each row lives through it).

    The clock does not wait for the device: on a GPU, where kernels run asynchronously, waiting at every phase
    boundary (10 host syncs a step) cost a launch-bound AR step a large share of its time (docs/results/gpu.md).
    So a phase is charged for the host's time in it, and the host waits where the step needs a value anyway: the
    accept rule's read of the verify logits (charged to `accept`) and the drafter's reads of its own outputs
    (`propose`). A step's total, and so the throughput `budget=auto` measures, stays its wall time; on cpu each
    phase is exactly its own time."""

    def __init__(self, stats: list[DecodeStats], phase: str) -> None:
        self.stats, self.phase = stats, phase

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self.t0
        for s in self.stats:
            s.times[self.phase] = s.times.get(self.phase, 0.0) + dt


def hit_stop(tokens: list[int], stop_ids: tuple[int, ...]) -> bool:
    """Whether a step emitted a stop token anywhere: a multi-token step can accept one mid-chunk, and
    checking only the last token would keep decoding (and counting forwards) past the end of the text."""
    return any(t in stop_ids for t in tokens)


def truncate(tokens: list[int], limit: int, stop_ids: tuple[int, ...]) -> list[int]:
    """Cut after the first stop token and at the token limit."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: min(i + 1, limit)]
    return tokens[:limit]
