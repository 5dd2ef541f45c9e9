"""EAGLE trees of every live row grown as one tensor program with their verify inputs; no host read till the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from specgen.decoding.draft import Draft
from specgen.decoding.tree import DraftTree
from specgen.decoding.verify import VerifyBatch, tree_inputs
from specgen.image.target import guided
from specgen.models import kernel_choice
from specgen.models.graphs import NODE_BUCKETS
from specgen.models.static_step import StaticInputs, drafter_input, eagle_step
from specgen.models.rope import Rotation, rows_rotation


@dataclass(frozen=True)
class TreeShape:
    """Depth (levels), width (top-k per expansion and beam size) and node budget of one draft tree."""

    depth: int
    top_k: int
    total_tokens: int

    @property
    def level_slots(self) -> int:
        """The drafter cache slots a growth writes past the committed pairs: top_k a level after the root's."""
        return max(self.depth - 1, 0) * self.top_k


@dataclass(frozen=True)
class GrownTrees:
    """A step's trees, still on the device (`grow`'s outputs), and the nodes each row keeps (known on the host)."""

    tokens: torch.Tensor  # [n, t]: slot order, then padding
    parents: torch.Tensor  # [n, t]: the parent's index in the row (-1: the root)
    counts: tuple[int, ...]  # [n]
    inputs: tuple[torch.Tensor, ...] = ()  # the verify's tokens, positions [n, t + 1], mask [n, t + 1, t + 1]; () none
    done: torch.cuda.Event | None = None  # the growth's end in the device's queue (`devices.mark`)

    def batch(self) -> VerifyBatch:
        """The verify's inputs (`tree_inputs`), cut to the fullest row (the shapes `host_batch` gives the drafts)."""
        s = 1 + max(self.counts)
        tokens, positions, mask = self.inputs
        if s < tokens.shape[1]:  # a slice is a host op: none where the fullest row fills the trees' width
            tokens, positions, mask = tokens[:, :s], positions[:, :s], mask[:, :s, :s]
        return VerifyBatch(tokens, positions, mask, tuple(1 + c for c in self.counts))

    def read(self, logits: torch.Tensor | None = None) -> tuple[list[Draft], list[list[int]] | None]:
        """The trees as drafts and, given the verify's logits [n, S, V], their greedy picks [n][S], in one copy."""
        t = self.tokens.shape[1]
        parts = [self.tokens, self.parents] + ([] if logits is None else [logits.argmax(-1)])  # int64 each
        rows = torch.cat(parts, 1).tolist()  # [n][2 t (+ S)]
        drafts = [Draft(tuple(row[:m]), DraftTree(tuple(row[t : t + m]))) for row, m in zip(rows, self.counts)]
        return drafts, None if logits is None else [row[2 * t :] for row in rows]


# feats [n*br, W, D] (given `grow` a `Join`, after the first level the drafter's input [n*br, W, 2 D] instead: the
# tokens' embeddings and the features side by side), tokens [n*br, W], parent [n, W] (each node's parent: its position
# in the previous level's frontier; None at the first level, whose parent is the root), the level's index i (0: the
# first forward; its nodes' positions: row i of the growth's `level_positions`), its attention lists [n*br, W, T]
# (given a `Join`; else None) -> hidden [n*br, W, D]; keeps the W slots. A node sees the committed slots, its
# ancestors' slots and its own: the forward keeps what it needs of the ancestry.
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, int, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class Children:
    """Each node's k best children from a drafter's hidden states [n * br, S, D], best first: the node's path score
    [n, S] (None: the root's, 0) plus the child's CFG-combined log-prob under the target's head, float32, and the
    child's token, written into a growth's record (`Frame`) from column `at` ([n, S * k] there) and returned as
    views [n, S, k] of it. On CUDA one kernel after the head (`top_children`), else torch's ops."""

    head: Callable[[torch.Tensor], torch.Tensor]  # [n * br, S, D] -> logits [n * br, S, V]
    branches: int  # 2: CFG pairs (cond, uncond), guided at `scale` (image/target.guided); 1: none
    scale: float

    def __call__(self, hidden: torch.Tensor, scores: torch.Tensor | None, k: int, frame: Frame,
                 at: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(hidden)
        n, s = logits.shape[0] // self.branches, logits.shape[1]
        values, tokens = (x[:, at : at + s * k].view(n, s, k) for x in (frame.scores, frame.tokens))
        if kernel_choice.one_pass(logits):
            torch.ops.specgen.top_children(logits, scores, self.branches, self.scale, k, frame.scores, frame.tokens,
                                           at)
            return values, tokens
        guided_logits = guided(logits, self.scale) if self.branches == 2 else logits  # [n, S, V]
        top, index = top_in_index_order(guided_logits.float().log_softmax(-1), k)  # [n, S, k] each
        values.copy_(top if scores is None else scores[..., None] + top)
        return values, tokens.copy_(index)


@dataclass(frozen=True)
class GrowPlan:
    """The host-known part of one step's growth: the root's width w0, then each level's frontier width."""

    widths: tuple[int, ...]  # (w0, W_1, .., W_{levels}); no level when only w0
    total: int  # the most nodes a row keeps
    feed: bool = True  # the growth builds the verify's inputs too (`tree_inputs`; VVS builds its own)

    @property
    def levels(self) -> int:
        """The drafter forwards after the root's (`level_positions` makes at least one level's)."""
        return max(len(self.widths), 2) - 1

    @classmethod
    def exact(cls, k: list[int], shapes: list[TreeShape], feed: bool = True) -> GrowPlan:
        """The eager plan: level L feeds the widest row still growing there (d_i > L)."""
        depth = [s.depth for s in shapes]
        levels = [max(ki for ki, d in zip(k, depth) if d > level) for level in range(1, max(depth))]
        return cls((max(k), *levels), max(s.total_tokens for s in shapes), feed)

    @classmethod
    def bucketed(cls, k: list[int], shapes: list[TreeShape], vocab: int, feed: bool = True) -> GrowPlan | None:
        """The captured plan: the widest row's width rounded up to a node bucket, at every level of the deepest row."""
        width = next((min(b, vocab) for b in NODE_BUCKETS if b >= max(k)), None)
        return width and cls((width,) * max(s.depth for s in shapes), max(s.total_tokens for s in shapes), feed)


def grow(forward: Forward, children: Children, root_hidden: torch.Tensor, ints: torch.Tensor, plan: GrowPlan,
         branches: int, frame: Frame, join: Join | None = None) -> tuple[torch.Tensor, ...]:
    """Each row's tree (slot order, parents as indices: `in_slot_order`) and, where the plan feeds, the verify's inputs
    for it (`tree_inputs`).

    `root_hidden` [n * br, 1, D]: the drafter's output at each root; `ints` [6, n]: the root token's position, the
    row's top-k (0: no tree), depth, kept nodes (`kept_counts`), drafter prefix and root token; `frame`: which nodes
    are padding (from the same ints); `join`: what the beam makes of the next level's inputs (a captured growth's).
    Device ops only; shapes depend only on the plan, the branches and the inputs' shapes.
    """
    root_pos, _, _, counts, _, roots = ints
    br, widths = branches, plan.widths
    values, tokens = (x[:, 0] for x in children(root_hidden, None, widths[0], frame, 0))  # 1. [n, w0]: the root's
    width = widths[1] if len(widths) > 1 else 0  # W_1: the frontier of level 1 is the best W_1 root children
    f_score, f_tok = values[:, :width], branch_rows(tokens[:, :width], br)  # [n, W], [n * br, W]
    f_hid, parent = root_hidden.expand(-1, width, -1), None  # [n * br, W, D]: the parents' predicted features
    seen = None if join is None else join.lists.first  # [n * br, W, T]: level 1's lists
    recorded = widths[0]
    for level in range(1, len(widths)):  # 2. one drafter forward per level, its W x W children recorded at `recorded`
        out = forward(f_hid, f_tok, parent, level - 1, seen)  # [n * br, W, D]
        children(out, f_score, width, frame, recorded)
        nxt = widths[level + 1] if level + 1 < len(widths) else 0
        if nxt:  # 3. the beam: each row's best k_i children over its whole frontier, the next level's parents
            f_score, parent, f_tok, f_hid, seen = beam(frame, recorded, width, nxt, br, out, join, level, seen)
        recorded += width * width
        width = nxt
    scores, padding, tokens, parents = frame.scores, frame.padding, frame.tokens, frame.parents  # [n, N] each
    if kernel_choice.one_pass(scores):  # 4.-5. as one Triton launch on CUDA: the same bits (native/cuda_ops.py)
        kept = torch.ops.specgen.kept_tree(scores, padding, tokens, parents, counts, roots, root_pos, plan.total,
                                           len(widths))
        return kept if plan.feed else kept[:2]
    ranked = best_nodes(scores, padding, plan.total)  # 4. the kept nodes: a rank prefix
    tokens, parents = in_slot_order(ranked, tokens, parents, counts)
    if not plan.feed:
        return tokens, parents
    return (tokens, parents) + tree_inputs(tokens, parents, counts, roots, root_pos, len(widths))  # 5.


def beam(frame: Frame, recorded: int, width: int, nxt: int, branches: int, hidden: torch.Tensor,
         join: Join | None = None, level: int = 0, seen: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Each row's best `nxt` children of a level's W x W recorded at column `recorded` of `frame` (path scores; its
    padding ones scored -inf): their path scores, parents (frontier positions) [n, nxt], each cache row's tokens
    [n * br, nxt] and its parents' predicted features, hidden [n * br, W, D] at them [n * br, nxt, D] (the next
    level's input; given a `join`, that input joined: [n * br, nxt, 2 D], the tokens' embeddings and the features side
    by side) and, given a `join`, the next level's (`level`'s) attention lists from this level's, `seen` [n * br, W, T]
    (else None); their slots (`recorded` + index), each `nxt` times, are the next level's parents in the record. On
    CUDA one kernel (`torch.ops.specgen.beam`), else torch's ops."""
    if kernel_choice.one_pass(frame.scores):
        lists = (None,) * 3 if join is None else (seen, join.lists.own[level], join.lists.tail[level])
        out = torch.ops.specgen.beam(frame.scores, frame.tokens, frame.padding, frame.parents, hidden,
                                     None if join is None else join.embedding, *lists, recorded, width, nxt, branches)
        return out if join is not None else (*out[:4], None)
    score, parent, tokens = best_children(frame, recorded, width, nxt, branches)
    feats = frontier_rows(hidden, parent, branches)
    if join is None:
        return score, parent, tokens, feats, None
    return (score, parent, tokens, drafter_input(join.embedding, tokens, feats),
            join.lists.level(level, seen, parent, branches))


def best_children(frame: Frame, recorded: int, width: int, nxt: int, branches: int) -> tuple[torch.Tensor, ...]:
    """`beam`'s ranking in torch's ops (its scores, parents and tokens)."""
    n, block = frame.scores.shape[0], slice(recorded, recorded + width * width)
    cand, tokens, pad = (x[:, block] for x in (frame.scores, frame.tokens, frame.padding))  # [n, W * W]
    # ties in slot order: child c of frontier node j ranks by (j, c) at whatever width W the batch pads the row to
    best, index = top_in_index_order(cand.masked_fill(pad, float("-inf")), nxt)  # [n, nxt] each
    f_tok = tokens[:, None].expand(-1, branches, -1).gather(  # each cache row's: one gather
        2, index[:, None].expand(-1, branches, -1)).flatten(0, 1)
    after = recorded + width * width
    frame.parents[:, after : after + nxt * nxt].view(n, nxt, nxt).copy_((recorded + index)[..., None])
    return best, index // width, f_tok


def top_in_index_order(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of float32 x [..., N], best first, ties in index order (the CUDA kernels' rank_key): values and
    indices [..., k]. A row's picks depend on its own values alone, where topk's order among ties (bfloat16 scores tie
    often) follows N and k, which a batch sets: its widest row's."""
    bits = (x + 0.0).view(torch.int32)  # -0.0 as 0.0: equal floats tie
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long()  # ordered as the floats (a negative's magnitude flipped)
    key = (ordered << 32) + (0x7FFFFFFF - torch.arange(x.shape[-1], device=x.device))  # distinct: no ties
    index = key.topk(k, dim=-1).indices
    return x.gather(-1, index), index


@dataclass(frozen=True)
class Frame:
    """A growth's record of its nodes, [n, N] each: the root's w0 children, then each level's W_i x W_i children (the
    i-th forward's, k = W_i of each frontier node, best first), level i's from column w0 + W_1^2 + .. + W_{i-1}^2.
    Which nodes are padding and the parents known before the first forward (the root children's, -1; level 1's, the
    root children 0 .. W_1 - 1) are made with it; scores, tokens and the later levels' parents are written as the
    growth goes (`Children`, `beam`), so the tail reads them in place (no join of per-level parts)."""

    padding: torch.Tensor  # [n, N] bool: a row past its depth, a node past k_i
    parents: torch.Tensor  # [n, N] int64: each node's parent slot (-1: the root)
    scores: torch.Tensor  # [n, N] float32: path scores
    tokens: torch.Tensor  # [n, N] int64

    @classmethod
    def make(cls, k: torch.Tensor, lives: torch.Tensor, widths: tuple[int, ...]) -> Frame:
        """From each row's top-k k [n] and whether it grows at each level (`level_positions`' lives [L, n])."""
        n, w0, device = k.shape[0], widths[0], k.device
        above = torch.arange(w0, device=device) >= k[:, None]  # [n, w0]: child rank / frontier position j >= k_i
        blocks = [above] + [(~lives[i, :, None, None] | above[:, None, :w] | above[:, :w, None]).flatten(1)
                            for i, w in enumerate(widths[1:])]
        padding = torch.cat(blocks, 1)
        parents = torch.full_like(padding, -1, dtype=torch.long)
        if len(widths) > 1:  # level 1's: the first W_1 root children, W_1 children each
            w = widths[1]
            parents[:, w0 : w0 + w * w] = torch.arange(w, device=device).repeat_interleave(w)
        return cls(padding, parents, *record_buffers(n, padding.shape[1], device))


def record_buffers(n: int, nodes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A growth record's scores (float32) and tokens (int64) [n, N], unwritten."""
    return (torch.empty(n, nodes, dtype=torch.float32, device=device),
            torch.empty(n, nodes, dtype=torch.long, device=device))


def record_width(widths: tuple[int, ...]) -> int:
    """N, the nodes a growth of these widths records: w0 + W_1^2 + .. + W_L^2."""
    return widths[0] + sum(w * w for w in widths[1:])


def level_positions(root_pos: torch.Tensor, depth: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels 1..`levels` (at least 1) of rows rooted at root_pos [n] with depths [n]: whether each row still grows
    there, and its nodes' position there (a row past its depth stays at its root's): [L, n] each."""
    at = torch.arange(1, levels + 1, device=root_pos.device)[:, None]  # [L, 1]
    lives = depth > at
    return lives, root_pos + at * lives


def kept_counts(k: list[int], depth: list[int], totals: list[int]) -> list[int]:
    """The nodes each row keeps, known on the host before the growth runs: its node budget, or all its valid nodes
    where fewer (the root's k children, then k x k at each further level: those not `grow`'s `padding`)."""
    return [min(t, ki + max(d - 1, 0) * ki * ki) if d > 0 else 0 for ki, d, t in zip(k, depth, totals)]


def static_growth(net, children: Children, cache: tuple[torch.Tensor, torch.Tensor], plan: GrowPlan,
                  branches: int, t: int, root_hidden: torch.Tensor, ints: torch.Tensor, writes: torch.Tensor
                  ) -> tuple[torch.Tensor, ...]:
    """`grow` over an EAGLE drafter's static cache (k, v [1, C + 1, Hkv, T_max, hd], models/graphs.py): what a captured
    growth replays. `ints` [6, n] as `grow`'s; `writes` [n * br]: the cache row each row writes (a padding row: the
    scratch row). Each level sees the first `t` slots of its rows (a width bucket that holds every prefix and the
    levels' slots). What depends only on the level (its nodes' rotation, cache offsets and tree columns) is made
    for every level at once: a captured plan has one width (`GrowPlan.bucketed`), so level i's W nodes go to slots
    prefix + W i and its tree columns are R = W (i + 1)."""
    rows = writes.shape[0]
    setup = GrowthSetup.make(ints, writes, net.rope_table, plan, branches, t, kernel_choice.one_pass(root_hidden))
    at_rows, meta, lists = setup.at_rows, setup.meta, setup.lists
    # one node a row (the kernels broadcast it over the level's W nodes): cos, sin [L * R, 1, 1, hd]
    turns = rows_rotation(setup.rope.to(net.fc.weight.dtype), net.cfg.rope_layout)

    def forward(feats, toks, parent, i, seen):
        part = slice(i * rows, (i + 1) * rows)
        pos = at_rows[i][:, None].expand(-1, toks.shape[1])  # [R, W]: a view (the rotation is given)
        joined = parent is not None  # after the first level the beam joined the input (`Join`)
        x = StaticInputs(toks, pos, meta[i], lists=(seen, lists.count[i], lists.shared),
                         features=None if joined else feats, joined=feats if joined else None,
                         rotation=Rotation(turns.cos[part], turns.sin[part], turns.layout))
        return eagle_step(net, x, *cache, None, t)[0]

    return grow(forward, children, root_hidden, ints, plan, branches, setup.frame,
                Join(net.tok_embeddings.weight, lists))


@dataclass(frozen=True)
class CapturedGrowth:
    """`static_growth` as a drafter's captured catch-up runs it on its roots, in the same replay (a `RootsNext`:
    `StepGraphs.catch_up`): `padded` sequences of `branches` cache rows at one width `t`. It keys the capture by
    what the graph bakes in (the plan, rows, width and CFG scale); its host ints are `grow`'s [6, padded], then each
    cache row's write row [padded * branches]."""

    padded: int
    plan: GrowPlan
    t: int
    branches: int
    scale: float
    net: torch.nn.Module = field(compare=False)
    children: Children = field(compare=False)
    cache: tuple[torch.Tensor, torch.Tensor] = field(compare=False)  # the drafter's static k, v

    @property
    def extra(self) -> int:
        return self.padded * (6 + self.branches)

    def __call__(self, roots: torch.Tensor, ints: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """roots [R, 1, D] (R, the catch-up's bucket rows, holds the padded rows: both round a power of two up),
        ints [extra] -> `static_growth`'s outputs over the padded sequences."""
        n, rows = self.padded, self.padded * self.branches
        return static_growth(self.net, self.children, self.cache, self.plan, self.branches, self.t, roots[:rows],
                             ints[: 6 * n].view(6, n), ints[6 * n :])


@dataclass(frozen=True)
class RootsAlone:
    """A captured catch-up with no tree after it (every row's budget or shape ends at its root): its roots."""

    extra: int = 0

    def __call__(self, roots: torch.Tensor, ints: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (roots,)


NO_GROWTH = RootsAlone()


@dataclass(frozen=True)
class GrowthSetup:
    """A captured growth's constants, all from the host-known ints (one width W, `GrowPlan.bucketed`): its frame, each
    cache row's node position, RoPE table row and cache meta at each level, and the levels' attention lists."""

    frame: Frame
    at_rows: torch.Tensor  # [L, R]: each cache row's node position (its sequence's)
    rope: torch.Tensor  # [L * R, 1, 2, hd]: the RoPE table's row at each of them
    meta: torch.Tensor  # [L, 2, R]: each level's first slot prefix + W i and write row (StaticInputs.meta)
    lists: LevelLists

    @classmethod
    def make(cls, ints: torch.Tensor, writes: torch.Tensor, table: torch.Tensor, plan: GrowPlan, branches: int,
             t: int, fused: bool) -> GrowthSetup:
        """From `ints` [6, n] (`grow`'s), each cache row's write row [R] and the drafter's RoPE table [P, 2, hd];
        `fused`: as one kernel (CUDA's `growth_setup`), else torch's ops."""
        (w,) = set(plan.widths)
        levels, rows = plan.levels, writes.shape[0]
        if fused:
            padding, parents, at_rows, meta, own, count, tail, shared, first, rope = torch.ops.specgen.growth_setup(
                ints, writes, table, levels, record_width(plan.widths), w, branches, t)
            return cls(Frame(padding, parents, *record_buffers(*padding.shape, ints.device)), at_rows, rope, meta,
                       LevelLists(first, own[..., None], tail[:, :, None], count, shared))
        root_pos, k, depth, _, prefix, _ = ints
        lives, positions = level_positions(root_pos, depth, levels)  # [L, n] each
        at_rows = positions[:, :, None].expand(-1, -1, branches).reshape(levels, rows)
        first = torch.arange(0, w * levels, w, device=prefix.device)  # [L]: each level's first tree column
        meta = torch.stack([branch_rows(prefix, branches) + first[:, None], writes.expand(levels, -1)], 1)
        return cls(Frame.make(k, lives, plan.widths), at_rows, table[at_rows.reshape(-1, 1)], meta,
                   LevelLists.make(meta[:, 0], w, t))


@dataclass(frozen=True)
class LevelLists:
    """A captured growth's attention lists (what the list attention reads, native/attention.c), made for every level
    at once: node j of level i writes slot s_i = prefix + W i + j of its cache row and sees the committed slots, one
    ancestor's slot a level and its own, ascending. Its list: entry p < prefix is slot p, entry prefix + l (l < i) its
    level-l ancestor's slot (its parent's entry there), every later one its own slot (the first prefix + i + 1 are
    read; the rest repeat a visible slot, so the list's slots are its visible ones)."""

    first: torch.Tensor  # [R, W, T] int32: level 0's lists (entry p's slot p before its tail)
    own: torch.Tensor  # [L, R, W, 1] int32: s_i
    tail: torch.Tensor  # [L, R, 1, T] bool: entries p >= prefix + i (level i's own)
    count: torch.Tensor  # [L, R, W] int32, contiguous: prefix + i + 1
    shared: torch.Tensor  # [R] int32: prefix, the leading run every list holds

    @classmethod
    def make(cls, first: torch.Tensor, w: int, t: int) -> LevelLists:
        """From each level's first slot [L, R] (prefix + W i), the W nodes a level and T = `t` slots."""
        levels, device = first.shape[0], first.device
        on = dict(dtype=torch.int32, device=device)
        at = torch.arange(levels, **on)[:, None]  # [L, 1]
        ends = (first[0] + at).int()  # [L, R]: prefix + i
        own = (first.int()[:, :, None] + torch.arange(w, **on))[..., None]
        slots = torch.arange(t, **on)
        count = (ends + 1)[:, :, None].expand(-1, -1, w).contiguous()
        tail = slots >= ends[:, :, None, None]
        return cls(torch.where(tail[0], own[0], slots), own, tail, count, ends[0])

    def level(self, i: int, seen: torch.Tensor | None, parent: torch.Tensor | None, branches: int) -> torch.Tensor:
        """Level i's lists [R, W, T] from its nodes' parents' lists: the last level's `seen` [R, W, T] at frontier
        positions parent [n, W] (None: the first level, whose nodes' parent is the root). On CUDA a growth's beam makes
        the later levels' in its launch (`beam`)."""
        if parent is None:  # level 0's, made with the growth's constants
            return self.first
        return torch.where(self.tail[i], self.own[i], frontier_rows(seen, parent, branches))


@dataclass(frozen=True)
class Join:
    """What a captured growth's beam makes of the next level's inputs beside choosing its nodes (on CUDA in the same
    launch): the drafter's input, its tokens' embeddings and its features side by side, and its attention lists."""

    embedding: torch.Tensor  # [V, D]: the drafter's token embedding
    lists: LevelLists


def frontier_rows(x: torch.Tensor, parent: torch.Tensor, branches: int) -> torch.Tensor:
    """Each cache row's values x [n * br, W, ...] at its sequence's frontier positions parent [n, W'] -> [n * br, W',
    ...]: one gather (the branches' index a view)."""
    n, w = parent.shape
    rows = x.unflatten(0, (n, branches))  # [n, br, W, ...]
    index = parent.view(n, 1, w, *(1,) * (x.dim() - 2)).expand(n, branches, w, *x.shape[2:])
    return rows.gather(2, index).flatten(0, 1)


def best_nodes(scores: torch.Tensor, padding: torch.Tensor, total: int) -> torch.Tensor:
    """The slots of the best `total` nodes of [n, N] in rank order [n, t] (t = min(total, N)): the valid ones (not
    `padding`) first by (-score, slot), a stable sort keeping ties in slot order (a -inf score still ranks before every
    padding node). A parent scores at least its children and precedes them: every rank prefix is a tree."""
    key = (-scores).clamp(max=torch.finfo(scores.dtype).max).masked_fill(padding, torch.inf)
    return key.argsort(dim=1, stable=True)[:, : min(total, scores.shape[1])]


def in_slot_order(ranked: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first counts[i] `ranked` slots [n, t] in slot (topological) order, then padding: their tokens and
    parents [n, t] from every node's tokens and parent slots [n, N] (-1: the root), a parent as its node's index in
    the row (-1: the root, and every padding node)."""
    n, t = ranked.shape
    pad = torch.arange(t, device=ranked.device) >= counts[:, None]  # [n, t]: past the rank prefix
    key = ranked.masked_fill(pad, tokens.shape[1] - 1).sort(dim=1).values  # the kept ascending, then the last slot
    parent = parents.gather(1, key)  # [n, t]: slots, each kept node's kept (the prefix is a tree) or the root
    index = torch.searchsorted(F.pad(key, (1, 0), value=-1), parent) - 1  # the root's -1 at -1
    return tokens.gather(1, key), index.masked_fill(pad, -1)


def branch_rows(x: torch.Tensor, branches: int) -> torch.Tensor:
    """Per-sequence [n, ...] -> per-cache-row [n * br, ...] (each sequence's branches side by side)."""
    return x[:, None].expand(x.shape[0], branches, *x.shape[1:]).flatten(0, 1) if branches > 1 else x


def slot_offsets(prefix: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For `level_mask` over T = `t` drafter slots: each slot's offset from its row's prefix [n, T] (slot - prefix_i),
    and whether it is a committed one [n, 1, T]."""
    rel = torch.arange(t, device=prefix.device)[None] - prefix[:, None]
    return rel, (rel < 0)[:, None]


def tree_columns(rel: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For `level_mask` over R = `r` tree columns: the column each drafter slot would be [n, T] (its offset `rel`
    clamped), and whether it is that column."""
    col = rel.clamp(0, r - 1)
    return col, col == rel


def level_mask(anc: torch.Tensor, columns: tuple[torch.Tensor, torch.Tensor], committed: torch.Tensor) -> torch.Tensor:
    """[n, W, T] bool over drafter slots: the committed ones (`slot_offsets`), plus the tree slots in `anc` [n, W, R]
    (slot prefix_i + r for column r); `columns`: `tree_columns` over the T slots (eagerly the longest prefix + R,
    captured the static cache's width)."""
    col, inside = columns
    return (anc.gather(2, col[:, None].expand(-1, anc.shape[1], -1)) & inside[:, None]) | committed
