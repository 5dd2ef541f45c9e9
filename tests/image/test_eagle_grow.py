"""The batched EAGLE tree growth (methods/eagle_grow.py) grows, for every row of a batch, the tree that row grows in a
batch of its own, and its node selection equals a plain sort of the recorded nodes."""

from __future__ import annotations

import random
import traceback

import pytest
import torch
import torch.nn.functional as F

from specgen.decoding.draft import Draft
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.tree import DraftTree
from specgen.decoding.verify import host_batch, tree_inputs
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.target import CFGTarget
from specgen.methods import run_batch
from specgen.methods.eagle import EagleTreeDrafter, TreeVerify
from specgen.methods.eagle_grow import (Frame, GrownTrees, GrowPlan, TreeShape, best_children, best_nodes,
                                       in_slot_order, top_in_index_order)
from specgen.methods.vvs import VVSBatch
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image_fixtures import one_thread

GRID = 4
_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread

# rows of one batch get different shapes: ADT-Tree adapts per image, and eagle2 here is given a wide, deep tree
SHAPES = {"eagle2": {"depth": 4, "top_k": 5, "total_tokens": 12},
          "adt-tree": {"total_tokens": 10, "k0": 3, "k_max": 7, "d0": 3}}


@pytest.mark.parametrize("method", sorted(SHAPES))
def test_batched_trees_are_the_trees_each_row_grows_alone(method, monkeypatch):
    model = tiny_image_gpt(5)
    target = CFGTarget(model, 3.0)
    parts = ImageParts(model, target, TinyEagle(model).eval(), None, GRID)
    labels, n = [0, 2, 1, 1, 2], GRID * GRID
    made: dict[int, EagleTreeDrafter] = {}

    def make(i):
        made[i] = build_image_method(method, parts, dict(SHAPES[method]))[0]
        made[i].seen = []
        return made[i]

    settled = TreeVerify.settle

    def record_pool(self, *args):
        outcomes = settled(self, *args)
        for d, draft in zip(self.pool.rows, self.drafts):
            d.seen.append(draft)
        return outcomes

    monkeypatch.setattr(TreeVerify, "settle", record_pool)
    alone = []
    for i, c in enumerate(labels):
        run_batch(target, lambda _: make(i), [[c]], n, SamplingParams(), max_draft=32)
        alone.append(made[i].seen)
    made.clear()
    run_batch(target, make, [[c] for c in labels], n, SamplingParams(), batch_size=3, max_draft=32)
    assert any(len(d.tokens) > 3 for seen in alone for d in seen)  # the trees branch and go deep
    assert [made[i].seen for i in range(len(labels))] == alone


def tied_level(ks: list[int], width: int, nxt: int) -> Frame:
    """A record holding one level at column 0: rows of top-k `ks` in a width x width block (child c of frontier node
    j at j * width + c, token 10 j + c), children 2i and 2i + 1 tied (bfloat16 scores tie), then room for the next
    level's parents."""
    j, c = torch.arange(width).repeat_interleave(width), torch.arange(width).repeat(width)
    k = torch.tensor(ks)[:, None]
    padding = torch.cat([(j >= k) | (c >= k), torch.ones(len(ks), nxt * nxt, dtype=torch.bool)], 1)
    scores = F.pad(-(c // 2).float(), (0, nxt * nxt)).expand(len(ks), -1).contiguous()
    tokens = F.pad(10 * j + c, (0, nxt * nxt)).expand(len(ks), -1).contiguous()
    return Frame(padding, torch.full_like(tokens, -1), scores, tokens)


@pytest.mark.parametrize("nxt", [2, 3])
def test_a_beam_keeps_tied_children_in_slot_order_at_any_frontier_width(nxt):
    """Which tied children a row keeps, and their order (the siblings sampled acceptance tries in turn), must not
    depend on the width its batch pads its frontier to: ties keep slot order (the CUDA kernel's rank_key's)."""
    alone = best_children(tied_level([3], 3, nxt), 0, 3, nxt, 1)
    beside = best_children(tied_level([3, 5], 5, nxt), 0, 5, nxt, 1)  # padded to a wider neighbour's frontier
    assert [x.tolist() for x in alone] == [x[:1].tolist() for x in beside]
    assert alone[2].tolist() == [[0, 1, 10][:nxt]] and alone[1].tolist() == [[0, 0, 1][:nxt]]


def test_top_in_index_order_ranks_ties_by_index_whatever_k():
    """A drafter node's children (k: the batch's widest row's) and a beam keep ties in index order, -inf last."""
    x = torch.tensor([-1.0, -2, -1, float("-inf"), -1, -2, 0.5, -0.0, 0.0, -1]).bfloat16().float()[None].repeat(2, 1)
    want = sorted(range(10), key=lambda i: (-float(x[0, i]), i))
    for k in range(1, 11):
        values, index = top_in_index_order(x, k)
        assert index.tolist() == [want[:k]] * 2 and torch.equal(values, x.gather(1, index))


def select_nodes(tokens: list[int], parents: list[int], scores: list[float], total: int) -> Draft:
    """The reference: the `total` best-scored nodes by (-score, id) and their ancestors, in recording order."""
    keep = set(sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:total])
    for i in list(keep):
        while parents[i] >= 0:
            keep.add(parents[i])
            i = parents[i]
    kept = sorted(keep)
    new_id = {old: new for new, old in enumerate(kept)}
    return Draft(tuple(tokens[i] for i in kept), DraftTree(tuple(new_id.get(parents[i], -1) for i in kept)))


def test_best_nodes_equal_the_reference_with_ties_and_padding():
    """Trees whose children never score above their parents (as EAGLE's do): the best nodes need no ancestor search."""
    rng = random.Random(0)
    rows, want, totals = [], [], []
    for _ in range(40):
        size = rng.randint(1, 30)
        parents = [-1 if j == 0 or rng.random() < 0.2 else rng.randrange(j) for j in range(size)]
        scores = []
        for p in parents:  # many ties, a child at most its parent's score
            step = float(rng.choice([0.0, -0.25, -0.5, -1.0]))
            scores.append(step - 0.5 if p < 0 else scores[p] + step)
        tokens = [rng.randrange(100) for _ in range(size)]
        total = rng.randint(1, size + 2)
        want.append(select_nodes(tokens, parents, scores, total))
        pad = sorted(rng.sample(range(size + 5), 5))  # padding slots interleaved with the row's own
        slot, row = iter(range(size)), []
        new = {}
        for s in range(size + 5):
            if s in pad:
                row.append((7, -1, 0.0, False))  # best score of all: padding must never be picked
            else:
                j = next(slot)
                new[j] = s
                row.append((tokens[j], new[parents[j]] if parents[j] >= 0 else -1, scores[j], True))
        rows.append(row)
        totals.append(total)
    width = max(map(len, rows))
    rows = [r + [(0, -1, 0.0, False)] * (width - len(r)) for r in rows]
    cols = list(zip(*[list(zip(*r)) for r in rows]))  # per field: n rows of `width` values
    counts = [len(w.tokens) for w in want]  # the node budget, or every valid node where fewer
    ranked = best_nodes(torch.tensor(cols[2]), ~torch.tensor(cols[3]), max(totals))
    tokens, parents = in_slot_order(ranked, torch.tensor(cols[0]), torch.tensor(cols[1]), torch.tensor(counts))
    roots, starts = [rng.randrange(100) for _ in rows], [rng.randrange(50) for _ in rows]
    inputs = tree_inputs(tokens, parents, torch.tensor(counts), torch.tensor(roots), torch.tensor(starts),
                         max(d.tree.max_depth() for d in want))
    trees = GrownTrees(tokens, parents, tuple(counts), inputs)
    drafts, picks = trees.read()
    assert drafts == want and picks is None
    logits = torch.randn(len(rows), max(counts) + 1, 9)
    assert trees.read(logits) == (want, logits.argmax(-1).tolist())
    ref = reference_inputs(roots, want, starts)
    for batch in (trees.batch(), host_batch(roots, want, starts).to("cpu")):  # from the device's trees, from drafts
        assert batch.sizes == tuple(d.size + 1 for d in want)
        assert [torch.equal(a, b) for a, b in zip((batch.tokens, batch.positions, batch.tree_mask), ref)] == [True] * 3


def reference_inputs(roots: list[int], drafts: list[Draft], starts: list[int]) -> tuple[torch.Tensor, ...]:
    """A verify's tokens, positions and tree mask by walking each node's parents: input 0 the root, a padding node
    the root's token at its position, seeing itself only."""
    s = 1 + max(d.size for d in drafts)
    tokens, positions, mask = torch.tensor([[r] * s for r in roots]), torch.tensor([[p] * s for p in starts]), []
    for i, d in enumerate(drafts):
        seen = torch.eye(s, dtype=torch.bool)
        for j, tok in enumerate(d.tokens):
            tokens[i, j + 1], node = tok, j
            while node >= 0:
                seen[j + 1, node + 1] = True
                positions[i, j + 1] += 1
                node = d.tree.parents[node]
            seen[j + 1, 0] = True
        mask.append(seen)
    return tokens, positions, torch.stack(mask)


def test_the_captured_plan_depends_only_on_the_buckets():
    """Eagerly each level is as wide as the widest row still growing; captured, rows of other widths and depths whose
    widest top-k falls in the same node bucket and whose deepest tree is as deep share one plan (one graph)."""
    a, b = [TreeShape(3, 5, 12), TreeShape(2, 7, 12)], [TreeShape(3, 8, 12), TreeShape(1, 6, 12)]
    assert GrowPlan.exact([5, 7], a) == GrowPlan((7, 7, 5), 12)
    assert GrowPlan.bucketed([5, 7], a, 100) == GrowPlan.bucketed([8, 6], b, 100) == GrowPlan((8, 8, 8), 12)
    assert GrowPlan.bucketed([5, 7], a, 6) == GrowPlan((6, 6, 6), 12)  # never wider than the vocabulary
    assert GrowPlan.bucketed([200], [TreeShape(2, 200, 12)], 1000) is None  # wider than every bucket: eager


def reads_before_verify(method: str, policy, monkeypatch) -> tuple[int, int]:
    """(steps, host reads between a step's plan and its verify) of `method` under the step policy class `policy`."""
    model = tiny_image_gpt(5)
    target = CFGTarget(model, 3.0)
    codebook = torch.randn(model.cfg.vocab_size, 8, generator=torch.Generator().manual_seed(0))  # LANTERN's, VVS's
    parts = ImageParts(model, target, TinyEagle(model).eval(), codebook, GRID)
    log: list[str] = []

    def read(real):
        def counted(self, *a, **k):  # the CPU's RoPE bound check reads (on a GPU: an assert queued on the device)
            log.extend("r"[: all(f.name != "forward_rotation" for f in traceback.extract_stack())])
            return real(self, *a, **k)

        return counted

    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, read(getattr(torch.Tensor, name)))
    for cls, name, mark in ((policy, "plan", "P"), (CFGTarget, "forward", "F")):
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda *a, _r=real, _m=mark, **k: log.append(_m) or _r(*a, **k))
    make = lambda _: build_image_method(method, parts, dict(SHAPES.get(method, {})))  # noqa: E731
    run_batch(target, lambda i: make(i)[0], [[0], [2]], GRID * GRID, SamplingParams(), batch_size=2, max_draft=32,
              rule=make(0)[1])
    between = [step.split("F")[0] for step in "".join(log).split("P")[1:]]  # each plan up to its verify
    return len(between), sum(b.count("r") for b in between)


@pytest.mark.parametrize("method", ["eagle2", "adt-tree", "lantern"])
def test_a_tree_step_reads_nothing_on_the_host_between_its_growth_and_its_verify(method, monkeypatch):
    """On a GPU a host read there idles the device while the host builds the verify: TreeVerify's trees and their
    verify inputs stay on the device until the verify is queued."""
    steps, reads = reads_before_verify(method, TreeVerify, monkeypatch)
    assert steps > 3 and reads == 0


def test_the_read_check_sees_a_step_that_reads_its_trees_when_grown(monkeypatch):
    """The control: VVS composes its trees with the unverified chain on the host, so it reads them when grown."""
    steps, reads = reads_before_verify("vvs", VVSBatch, monkeypatch)
    assert steps > 3 and reads >= steps - 1


def test_a_captured_levels_lists_are_the_plan_of_its_ancestors_mask():
    """A captured growth's attention lists (LevelLists, made from each node's parent's) are what the list attention's
    plan makes of the eager growth's mask (the committed slots, the ancestors' and its own), and that mask is theirs:
    3 CFG sequences at different prefixes, 3 levels of 4 nodes with random parents."""
    from specgen import native
    from specgen.methods.eagle_grow import LevelLists, branch_rows, level_mask, slot_offsets, tree_columns
    from specgen.models.static_step import StaticInputs, visibility

    if native.library("attention") is None:
        pytest.skip("no C compiler: the native plan is not built here")
    g = torch.Generator().manual_seed(0)
    n, br, w, levels, t = 3, 2, 4, 3, 32
    prefix = torch.tensor([5, 0, 9])
    starts = branch_rows(prefix, br)
    lists = LevelLists.make(starts + torch.arange(0, w * levels, w)[:, None], w, t)
    eye = torch.eye(w, dtype=torch.bool).expand(n, -1, -1)
    rel, committed = slot_offsets(prefix, t)
    anc = seen = None
    for i in range(levels):
        parent = None if i == 0 else torch.randint(0, w, (n, w), generator=g)
        anc = eye if parent is None else torch.cat([anc.gather(1, parent[..., None].expand(-1, -1, anc.shape[-1])),
                                                    eye], 2)
        seen = lists.level(i, seen, parent, br)  # [R, W, T]
        mask = branch_rows(level_mask(anc, tree_columns(rel, anc.shape[-1]), committed), br)  # [R, W, T]
        idx, count, shared = torch.ops.specgen.attention_plan(mask)
        assert torch.equal(lists.count[i], count) and torch.equal(lists.shared, starts.int())
        assert all(torch.equal(a[:c], b[:c]) for a, b, c in zip(idx.flatten(0, 1), seen.flatten(0, 1),
                                                                count.flatten().tolist()))
        assert bool((lists.shared <= shared).all())  # the leading run every list holds: at least the prefix
        x = StaticInputs(torch.zeros(n * br, w, dtype=torch.long), None, None,
                         lists=(seen, lists.count[i], lists.shared))
        assert torch.equal(visibility(x, t)[:, 0], mask)  # the mask of the lists (another attention path's)
