"""EAGLE-2 draft trees from a feature drafter, with CFG: a shape policy per row, one pool growing every row's tree."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from specgen.decoding.cost import Tokens
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.draft_verify import DrafterBase, DraftVerify, judge
from specgen.decoding.pool import PoolBase, RowStep
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import Target, TargetOut
from specgen.decoding.tree import DraftTree
from specgen.decoding.verify import HostBatch, Span, forward_span, host_batch
from specgen.devices import host_tensor, mark, wait_for
from specgen.methods.eagle_grow import (NO_GROWTH, CapturedGrowth, Children, Frame, GrownTrees, GrowPlan, TreeShape,
                                        branch_rows, grow, kept_counts, level_mask, level_positions, slot_offsets,
                                        tree_columns)
from specgen.models.cache import KVCache
from specgen.models.graphs import ROW_BUCKETS, RootsNext


class ShapePolicy(ABC):
    """Chooses each tree's shape and learns from its outcome (fixed for EAGLE-2, adaptive for ADT-Tree); this base
    learns nothing."""

    def reset(self) -> None:
        pass

    @abstractmethod
    def shape(self, next_index: int) -> TreeShape:
        """Shape of the tree drafting the token with sequence index `next_index` onwards."""

    @property
    @abstractmethod
    def largest(self) -> TreeShape:
        """The deepest and widest shape, and the node budget, of every tree it chooses (sizes the caches)."""

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        """`accepted` draft tokens were accepted; `committed` tokens (accepted + bonus) were added."""


@dataclass
class FixedShape(ShapePolicy):
    """EAGLE-2: the same shape for every tree."""

    tree: TreeShape

    def shape(self, next_index: int) -> TreeShape:
        return self.tree

    @property
    def largest(self) -> TreeShape:
        return self.tree


@dataclass
class EagleTreeDrafter(DrafterBase):
    """One row's EAGLE drafter: the feature drafter, its head and CFG scale, the tree policy, and the row's state
    between steps (set by the pool that grows every live row's tree together, `EagleBatch`)."""

    net: torch.nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]  # hidden [B, S, D] -> logits [B, S, V] (target's head)
    policy: ShapePolicy
    max_len: int = 4096
    # the target's CFG scale (CFGTarget.cfg_scale; 1: none): the drafter's logits are guided as the target's
    # (`eagle_grow.Children`); a captured tree growth bakes it in, so it keys the capture
    guidance: float = 1.0
    pending: torch.Tensor | None = None  # [br, m, D]: f of the pairs the next catch-up runs
    last_shape: TreeShape | None = None  # the shape of the tree the next verdict judges (None: no observation)
    last_index: int = 0
    owed: bool = False  # a step ran without drafting: its pairs wait for the next catch-up
    backlog: list[torch.Tensor] = field(default_factory=list)  # [br, a + 1, D] pairs of the owed steps, in order

    def step_policy(self, make: Callable[[int], "EagleTreeDrafter"], target, rule, budget) -> DraftVerify:
        """Draft-verify over the DrafterPool that grows every live row's tree together (`EagleBatch` below)."""
        # a whole tree at any draft depth: the loop's cache holds its policy's largest
        return TreeVerify(EagleBatch(make, self.policy.largest.total_tokens), rule, budget)


@dataclass(frozen=True)
class DrafterForward(Tokens):
    """`cost.Timed` of a feature drafter's forward as a tree level runs it: the net over tokens and features (zeros: the
    values do not change the time) after a committed prefix, then the target's LM head `head` on its output (every
    level scores its nodes' children with it; the catch-up needs only its last row's: a slight overcount there)."""

    module: torch.nn.Module  # the drafter net (EagleNet): its limit and vocabulary read as a Transformer's
    head: torch.nn.Module

    def describe(self) -> str:
        dtypes = sorted({str(t.dtype) for t in self.head.state_dict().values()})
        return f"{self.module.cfg!r} then {self.head!r} in {dtypes}"

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """Zero features [1, S, D] for ids [1, S]."""
        return torch.zeros(*ids.shape, self.module.cfg.dim, device=ids.device)

    def prepare(self, ids: torch.Tensor, positions: torch.Tensor, prefix: int):
        cache = self.module.new_cache(1, ids.shape[1])
        self.module(self.features(ids[:, :prefix]), ids[:, :prefix], positions[:, :prefix], cache)
        cache.commit(0, list(range(prefix)))
        return cache

    def forward(self, state, ids: torch.Tensor, positions: torch.Tensor) -> None:
        self.head(self.module(self.features(ids), ids, positions, state))  # as `Children` scores a level


@dataclass(frozen=True)
class Pairs:
    """A catch-up's inputs: the pairs (f_p, x_{p+1}) each row committed since its last catch-up (`EagleBatch.pairs`)."""

    features: torch.Tensor  # [n * br, M, D]: each branch row's f, zeros after its pairs
    batch: HostBatch  # tokens, positions [n * br][M] on the host (a padded chain's tree mask)
    sizes: list[int]  # [n]: pairs a sequence


class TreeVerify(DraftVerify):
    """Draft-verify over `EagleBatch` with the trees left on the device until the verdict: the growth builds the
    verify's inputs too, so nothing waits between the growth and the verify (on a GPU they run back to back), and the
    trees are read with the verify's greedy picks, in one copy a step."""

    trees: GrownTrees | None = None

    def propose(self, seqs, budgets: list[int], stats) -> list[RowStep]:
        """Every live row's tree and its verify inputs, on the device: the steps feed no draft (`forward` feeds
        them)."""
        self.trees = self.pool.grow_trees(seqs, budgets, stats)
        return [RowStep(seq[-1]) for seq in seqs]

    def forward(self, target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
        if self.trees is None:  # no tree this step: every row feeds its root alone
            return forward_span(target, cache, feeds)
        batch = self.trees.batch()  # 2. every live row (DraftVerify feeds them all: rows [0, n))
        view = cache.rows(0, len(feeds) * target.branches)
        return Span(view, target.forward(batch.tokens, batch.positions, view, batch.tree_mask), batch.sizes)

    def settle(self, rows, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        trees, picks = self.trees, None
        if trees is None:
            self.drafts = [Draft.empty() for _ in rows]
        else:
            with clock("propose"):  # the growth's device time is the drafter's: wait for it alone, the verify runs on
                wait_for(trees.done)
            with clock("accept"):  # 3. the trees, with the greedy rule's picks
                self.drafts, picks = trees.read(out.logits if self.rule is judge and params.greedy else None)
        return super().settle(rows, lo, out if picks is None else replace(out, argmax=picks), sizes, params,
                              generators, stats, clock)


class EagleBatch(PoolBase):
    """DrafterPool over `make(index)` -> EagleTreeDrafter (each row's policy and state; the net runs batched)."""

    def __init__(self, make: Callable[[int], EagleTreeDrafter], max_feed: int = 0, skip_ar_steps: bool = True) -> None:
        self.make, self.max_feed = make, max_feed  # max_feed: the most nodes of a tree (`DrafterPool.max_feed`)
        # a step whose every row may draft nothing skips the drafter (VVS, which sets the features itself: False)
        self.skip_ar_steps = skip_ar_steps
        self.forwards: list[int] = []  # the drafter forwards of the last growth, rows x tokens (`drafted`)

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        d = self.make(index)
        d.policy.reset()
        d.last_shape = None
        d.pending = first.features[:, -1:]  # [br, 1, D]: f of the last prompt position
        self.vocab = first.logits.shape[-1]  # the drafter's head is the target's
        d.owed = False
        d.backlog = []  # joined to `pending` once, by the catch-up (joining step by step is quadratic)
        if self.cache is None:
            self.net, self.br = d.net, first.features.shape[0]
            self.children = Children(d.head, self.br, d.guidance)
            self.cache = d.net.new_cache(len(self.rows) * self.br, d.max_len)
        self.cache.clear_seq(slot, self.br)
        self.rows[slot] = d

    def propose(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats]) -> list[Draft]:
        """The trees read on the host now (VVS composes them with its chain there): no verify inputs grown."""
        trees = self.grow_trees(seqs, budgets, stats, feed=False)
        return [Draft.empty() for _ in seqs] if trees is None else trees.read()[0]

    @torch.inference_mode()
    def grow_trees(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats],
                   feed: bool = True) -> GrownTrees | None:
        """Every live row's tree and (`feed`) its verify inputs, on the device (None: no row drafts a tree)."""
        n, br = len(seqs), self.br
        self.forwards = []
        if self.skip_ar_steps and all(b <= 0 for b in budgets):  # a batched AR step: no drafter work at all;
            for d in self.rows[:n]:  # the pairs committed meanwhile are caught up by the next step that drafts
                d.owed, d.last_shape = True, None
            return None
        view = self.cache.rows(0, n * br)
        pairs = self.pairs(self.rows[:n], seqs)  # 1. the pairs committed since each row's last catch-up
        shapes = []
        for d, seq, budget, s in zip(self.rows, seqs, budgets, stats):
            shape = d.policy.shape(len(seq))
            # a step the loop's budget cut to AR is no evidence about the policy's tree: it does not observe it
            cut = budget <= 0 < shape.depth
            d.last_index, d.last_shape = len(seq), None if cut else shape
            shapes.append(TreeShape(min(shape.depth, budget), shape.top_k, shape.total_tokens))
            s.drafter_forwards += max(shapes[-1].depth, 1)  # the catch-up, then one forward per level after the first
        if all(s.depth <= 0 for s in shapes):  # every row's budget or shape ends at the root: no tree to score
            if self.caught_up(view, pairs, NO_GROWTH, []) is None:
                self.catch_up(view, pairs)
            return None
        prefix = [length + m for length, m in zip(view.lengths[::br], pairs.sizes)]  # [n]: committed drafter slots
        k = [min(s.top_k, self.vocab) if s.depth > 0 else 0 for s in shapes]
        depth = [s.depth for s in shapes]
        # a level's forward runs every row's frontier at the widest (a captured growth pads further: its rows are the
        # launch's, not the work a step needs)
        self.forwards += [n * br * w for w in GrowPlan.exact(k, shapes, feed).widths[1:]]
        counts = kept_counts(k, depth, [s.total_tokens for s in shapes])
        ints = [[len(s) - 1 for s in seqs], k, depth, counts, prefix, [s[-1] for s in seqs]]
        grown = self.grow_captured(view, pairs, ints, shapes, feed)  # 1.-5. in one replay
        if grown is None:  # 1., then 2.-5. level by level past what the forward left committed (the tests' oracle
            roots = self.catch_up(view, pairs)  # drafters commit a prompt in their first one)
            ints[4] = list(view.lengths[::br])
            grown = self.grow_eager(view, roots, ints, shapes, feed)
        return GrownTrees(grown[0], grown[1], tuple(counts), grown[2:], mark(pairs.features.device))  # unread

    def grow_eager(self, view, root_hidden: torch.Tensor, ints: list[list[int]], shapes: list[TreeShape], feed: bool):
        """The growth level by level through the drafter's forward over `view` (exact widths, keys up to the longest
        prefix); `ints` [6][n] as `grow`'s."""
        br, longest = self.br, max(ints[4])
        ints_t = host_tensor(ints, root_hidden.device)  # [6, n]
        c = ints_t[4]

        plan = GrowPlan.exact(ints[1], shapes, feed)
        levels = level_positions(ints_t[0], ints_t[2], plan.levels)  # [L, n] each

        anc, eyes = None, {}  # [n, W, R]: each node's ancestors and itself among the R tree columns so far

        def forward(feats, toks, parent, i, _lists):  # one level; each row keeps its W written slots till the rollback
            nonlocal anc
            w = toks.shape[1]
            if w not in eyes:
                eyes[w] = torch.eye(w, dtype=torch.bool, device=toks.device)
            eye = eyes[w].expand(len(c), -1, -1)
            anc = eye if parent is None else torch.cat([anc.gather(1, parent[..., None].expand(-1, -1, anc.shape[-1])),
                                                        eye], 2)
            rel, committed = slot_offsets(c, longest + anc.shape[-1])
            mask = level_mask(anc, tree_columns(rel, anc.shape[-1]), committed)  # [n, W, T]
            pos = branch_rows(levels[1][i][:, None].expand(-1, anc.shape[1]), br)  # [n * br, W]
            out = self.net(feats, toks, pos, view, attn_mask=branch_rows(mask, br).unsqueeze(1))
            view.lengths = [length + toks.shape[1] for length in view.lengths]
            return out
        frame = Frame.make(ints_t[1], levels[0], plan.widths)
        return grow(forward, self.children, root_hidden, ints_t, plan, br, frame)

    def grow_captured(self, view, pairs: Pairs, ints: list[list[int]], shapes: list[TreeShape], feed: bool):
        """The catch-up and the growth as one replay of the drafter's captured steps (rows padded to a bucket, widths
        to the plan's), or None where they run eagerly (no captured steps, another cache, no room for the levels)."""
        graphs, n, br = self.net.graphs, len(shapes), self.br
        if graphs is None or graphs.k is None:  # whether the view is its buffer: the replay asks (`servable`)
            return None
        plan = GrowPlan.bucketed(ints[1], shapes, self.vocab, feed)
        if plan is None:
            return None
        slots = max(ints[4]) + sum(plan.widths[1:])  # the longest prefix + the levels' slots
        if slots > graphs.k.shape[3]:
            return None
        padded = next((r for r in ROW_BUCKETS if n <= r and r * br <= graphs.capacity), n)
        pad = padded - n  # padding sequences: no tree (k = 0), their rows write into the scratch row
        # keyed by its CFG scale too: a later pool's growths reuse it at its own
        growth = CapturedGrowth(padded, plan, graphs.width(slots), br, self.children.scale, self.net, self.children,
                                (graphs.k, graphs.v))
        # staged with the catch-up's inputs: `ints` [6, padded], then each cache row's write row [padded * br]
        host = [v for x in ints for v in x + [0] * pad] + list(range(n * br)) + [graphs.capacity] * (pad * br)
        outs = self.caught_up(view, pairs, growth, host)
        if outs is None or not pad:  # a slice is a host op: none where no row pads
            return outs
        return tuple(p[:n] for p in outs)

    def caught_up(self, view, pairs: Pairs, then: RootsNext, ints: list[int]) -> tuple[torch.Tensor, ...] | None:
        """The pairs' catch-up and `then` on its roots as one replay of the drafter's captured steps, the pairs
        committed: `then`'s outputs; None where they run eagerly."""
        graphs = self.net.graphs
        outs = None if graphs is None else graphs.catch_up(pairs.batch, view, pairs.features, then, ints)
        if outs is not None:
            self.commit_pairs(view, pairs.sizes)
        return outs

    def pairs(self, rows, seqs) -> Pairs:
        """The pairs (f_p, x_{p+1}) each row committed since its last catch-up, every row padded to the most."""
        for d in rows:
            if d.backlog:
                d.pending, d.backlog = torch.cat([d.pending, *d.backlog], 1), []
        br, ms = self.br, [d.pending.shape[1] for d in rows]
        n, width = len(rows), max(ms)
        self.forwards.append(n * br * width)  # every row padded to the most pairs
        # [n * br, M, D]: each row's pairs, zeros after them (no op for a row as wide as the widest, nor to join one)
        padded = [d.pending if m == width else F.pad(d.pending, (0, 0, 0, width - m)) for d, m in zip(rows, ms)]
        per_row = [(seq, m) for seq, m in zip(seqs, ms) for _ in range(br)]  # each branch row: its sequence's chain
        batch = host_batch([seq[-m] for seq, m in per_row],  # the last m tokens, from position len - m
                           [Draft(tuple(seq[len(seq) - m + 1:]), DraftTree.chain(m - 1)) for seq, m in per_row],
                           [len(seq) - m for seq, m in per_row])
        return Pairs(padded[0] if n == 1 else torch.cat(padded), batch, ms)

    def catch_up(self, view, pairs: Pairs) -> torch.Tensor:
        """Run the pairs eagerly and commit them: each branch row's features at its last pair [n * br, 1, D]."""
        br, ms, width = self.br, pairs.sizes, pairs.features.shape[1]
        inputs = pairs.batch.to(pairs.features.device)
        hidden = self.net(pairs.features, inputs.tokens, inputs.positions, view, tree_mask=inputs.tree_mask)
        if ms.count(width) == len(ms):  # every row's last pair in the last column (every step at batch 1): one view
            roots = hidden[:, -1:]
        else:
            last = host_tensor([m - 1 for m in ms for _ in range(br)], hidden.device)
            roots = hidden[torch.arange(len(ms) * br, device=hidden.device), last].unsqueeze(1)
        self.commit_pairs(view, ms)
        return roots

    def commit_pairs(self, view, ms: list[int]) -> None:
        """The caught-up pairs stay; a growth's levels write past every row's length (the view's lengths)."""
        view.commit_seqs({i: list(range(m)) for i, m in enumerate(ms)}, self.br)
        self.cache.absorb(view, 0)

    def drafted(self) -> list[int]:
        return self.forwards

    def on_accept(self, drafts: Sequence[Draft], verdicts: Sequence[Verdict], out: TargetOut,
                  sizes: Sequence[int], branches: int) -> None:
        for i, verdict in enumerate(verdicts):
            rows = out.features if len(verdicts) == 1 else out.features[i * branches : (i + 1) * branches]  # [br, S, D]
            kept = verdict.kept()
            # kept nodes that are the first ones (the root alone, a path down first children) are a view, no copy: the
            # features are the verify's own (a target's outputs are copies: graphs.StepKind.kept)
            self.learn(i, rows[:, : len(kept)] if kept[-1] == len(kept) - 1 else
                       rows.index_select(1, host_tensor(kept, rows.device)), verdict)  # no host wait

    def learn(self, slot: int, new: torch.Tensor, verdict: Verdict) -> None:
        """Row `slot`'s drafter after `verdict`: kept nodes' features `new` [br, a + 1, D] feed its next catch-up."""
        d = self.rows[slot]
        # after steps without drafting the drafter still owes the pairs of those steps: f lines up with the tokens
        if d.owed:
            d.backlog.append(new)
        else:
            d.pending = new
        d.owed = False
        if d.last_shape is not None:
            d.policy.observe(d.last_index, d.last_shape, verdict.num_accepted, len(verdict.tokens))
