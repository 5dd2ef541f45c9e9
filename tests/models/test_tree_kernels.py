"""A tree growth's kernels on CUDA (native/cuda_ops.py): its constants (`growth_setup`) are torch's, bit for bit; its
rankings (`top_children`, `beam`) the ranks torch's ops give (log-softmax of the CFG-guided logits, top-k, path
scores; the beam's top-k over a row's frontier), ties to the lower index; and a whole growth through them and
`kept_tree` grows the trees torch's ops grow. On the CPU they run in Triton's interpreter; under `gpu` compiled."""

from __future__ import annotations

import os
import traceback
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specgen.image.target import guided
from specgen.methods import eagle_grow
from specgen.native import cuda_ops

pytest.importorskip("triton")


def torch_children(logits, scores, branches, scale, k):
    """What `Children` computes with torch's ops from the head's logits."""
    top = (guided(logits, scale) if branches == 2 else logits).float().log_softmax(-1).topk(k, dim=-1)
    return (top.values if scores is None else scores[..., None] + top.values), top.indices


def kernel_children(logits, scores, branches, scale, k, at=3):
    """`cuda_ops.top_children` into a record of sentinels from column `at` (a few columns on either side): its
    values and tokens [n, S, k]; every column outside theirs still the sentinel."""
    n, s = logits.shape[0] // branches, logits.shape[1]
    values = torch.full((n, at + s * k + 5), -7.0, device=logits.device)
    index = torch.full_like(values, -7, dtype=torch.long)
    cuda_ops.top_children(logits, scores, branches, scale, k, values, index, at)
    outside = torch.ones(values.shape[1], dtype=torch.bool)
    outside[at : at + s * k] = False
    assert (values[:, outside] == -7).all() and (index[:, outside] == -7).all()
    return values[:, at : at + s * k].view(n, s, k), index[:, at : at + s * k].view(n, s, k)


@pytest.mark.parametrize("branches,v,k,scored", [(2, 512, 8, True), (1, 5000, 16, False), (2, 37, 5, True)])
def test_top_children_gives_the_log_softmax_top_k_and_path_scores(device, branches, v, k, scored):
    """float32 logits (no ties): the same children in the same order, log-probs within float32 rounding (the kernel
    sums the softmax in its own order); a vocabulary of several tiles (5000 over 2048) and of one short one."""
    g = torch.Generator().manual_seed(v)
    logits = (torch.randn(3 * branches, 4, v, generator=g) * 3).to(device)
    scores = torch.randn(3, 4, generator=g).to(device) if scored else None
    values, index = kernel_children(logits, scores, branches, 4.0, k)
    want_values, want_index = torch_children(logits, scores, branches, 4.0, k)
    assert torch.equal(index, want_index)
    torch.testing.assert_close(values, want_values, rtol=0, atol=2e-6)


def test_top_children_ranks_ties_by_the_lower_token_and_guides_bfloat16_as_torch(device):
    """bfloat16 logits, rounded at each of CFG's three steps as `guided` rounds them: each child's log-prob is the
    torch one of its token; equal logits rank the lower token first (torch's top-k leaves tie order open)."""
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 3, 3000, generator=g) * 3).to(device, torch.bfloat16)
    values, index = kernel_children(logits, None, 2, 4.0, 6, at=0)
    lp = guided(logits, 4.0).float().log_softmax(-1)
    torch.testing.assert_close(values, lp.gather(-1, index), rtol=0, atol=2e-6)
    torch.testing.assert_close(values, lp.topk(6, dim=-1).values, rtol=0, atol=2e-6)
    flat = torch.zeros(1, 1, 64, device=device)
    flat[0, 0, [9, 40, 3]] = 1.0
    assert kernel_children(flat, None, 1, 1.0, 4)[1].tolist() == [[[3, 9, 40, 0]]]


def test_the_beam_keeps_each_rows_best_children_as_torch_does(device):
    """The best `nxt` of each row's W x W children in a growth's record (padding never before a real child): their
    scores, parents, each branch row's tokens and its features at those parents (the next level's inputs, bf16 and
    float32, their bits; given a `Join`, joined with the tokens' embeddings as `embed_cat` joins them, and the next
    level's attention lists: its parent's with its own slot from its tail on), and their slots as the next level's
    parents in the record: `eagle_grow.beam`'s torch path, bit for bit; nothing else of the record written."""
    g = torch.Generator().manual_seed(2)
    n, recorded, w, nxt, t = 3, 10, 8, 6, 200  # t: two list steps, the second partial
    nodes = recorded + w * w + nxt * nxt + 4
    for dtype, dim, join in ((torch.bfloat16, 200, False), (torch.float32, 24, False), (torch.bfloat16, 200, True),
                             (torch.float32, 24, True)):  # 200: two feature steps, the second partial
        frame = eagle_grow.Frame(torch.rand(n, nodes, generator=g) < 0.4, torch.full((n, nodes), -5),
                                 torch.randn(n, nodes, generator=g), torch.randint(0, 500, (n, nodes), generator=g))
        hidden = torch.randn(2 * n, w, dim, generator=g).to(dtype)
        seen = torch.randint(0, 1000, (2 * n, w, t), generator=g, dtype=torch.int32)
        own = torch.randint(0, 1000, (2, 2 * n, nxt, 1), generator=g, dtype=torch.int32)  # levels 0 and 1's
        tail = torch.arange(t) >= torch.randint(0, t, (2, 2 * n, 1, 1), generator=g)  # [2, R, 1, t]
        lists = eagle_grow.LevelLists(None, own, tail, None, None)  # what a beam reads of them
        joined = eagle_grow.Join(torch.randn(500, dim, generator=g).to(dtype), lists) if join else None
        on = eagle_grow.Frame(*(x.to(device) for x in vars(frame).values()))
        on_join = joined and eagle_grow.Join(joined.embedding.to(device), eagle_grow.LevelLists(
            *(None if x is None else x.to(device) for x in vars(lists).values())))
        with pytest.MonkeyPatch.context() as m:  # the kernel (on the CPU: the interpreter's)
            m.setattr(eagle_grow, "kernel_choice", SimpleNamespace(one_pass=lambda x: True))
            m.setattr(torch.ops.specgen, "beam", cuda_ops.beam)
            got = eagle_grow.beam(on, recorded, w, nxt, 2, hidden.to(device), on_join, 1, seen.to(device))
        want = eagle_grow.beam(frame, recorded, w, nxt, 2, hidden, joined, 1, seen)  # CPU tensors: torch's ops
        assert len(got) == len(want) == 5 and all(a is b is None or torch.equal(a.cpu(), b) for a, b in zip(got, want))
        assert torch.equal(on.parents.cpu(), frame.parents) and (frame.parents[:, : recorded + w * w] == -5).all()
        kept = frame.parents[:, recorded + w * w :: nxt][:, :nxt] - recorded  # the kept children's indices
        assert not frame.padding[:, recorded:].gather(1, kept).any()
        feats = want[3][..., dim:] if join else want[3]
        assert feats.shape == (2 * n, nxt, dim) and not torch.equal(feats, hidden[:, :nxt])  # the gather moved rows
        if join:  # the controls: each node's embedding is its own token's; its list its parent's, then its own slot
            emb = joined.embedding
            assert torch.equal(want[3][..., :dim], emb[want[2]]) and not torch.equal(want[3][..., :dim], emb[:nxt])
            mine = tail[1].expand(-1, nxt, -1)  # [R, nxt, t]: the entries from each node's own on
            assert want[4].shape == (2 * n, nxt, t) and torch.equal(want[4][mine], own[1].expand(-1, -1, t)[mine])
            assert not torch.equal(want[4][~mine], seen[:, :nxt][~mine])  # its parent's list: the gather moved rows


SETUPS = [  # ints [6, n] (root positions, top-k, depths, counts, prefixes, roots), plan widths, branches, T
    ([[3, 4, 5], [5, 2, 4], [3, 0, 2], [12, 0, 12], [4, 5, 6], [7, 8, 9]], (8, 8, 8), 2, 32),
    ([[0, 9], [1, 16], [1, 5], [1, 60], [200, 3], [1, 2]], (16,) * 5, 1, 300),  # T past a tile; a row of depth 1
    ([[2], [4], [1], [4], [7], [0]], (4,), 2, 16),  # the root's children alone
]


@pytest.mark.parametrize("case", range(len(SETUPS)))
def test_the_growth_setup_kernel_gives_torchs_constants(device, case):
    """Every constant of a captured growth (its frame, positions, RoPE rows, meta and attention lists, level 0's
    among them), bit for bit and dtype for dtype, from one launch; the control (another T) differs."""
    ints, widths, branches, t = SETUPS[case]
    ints = torch.tensor(ints, device=device)
    writes = torch.arange(ints.shape[1] * branches, device=device)
    table = torch.randn(300, 2, 24, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)  # [P, 2, hd]
    plan = eagle_grow.GrowPlan(widths, 12)
    parts = lambda s: (s.frame.padding, s.frame.parents, s.at_rows, s.rope, s.meta, s.lists.first,  # noqa: E731
                       s.lists.own, s.lists.tail, s.lists.count, s.lists.shared)
    want = parts(eagle_grow.GrowthSetup.make(ints.cpu(), writes.cpu(), table, plan, branches, t, False))
    assert not torch.equal(want[3], table[: want[3].shape[0], None])  # the rows of the levels' positions
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.ops.specgen, "growth_setup", cuda_ops.growth_setup)
        table = table.to(device)
        got = parts(eagle_grow.GrowthSetup.make(ints, writes, table, plan, branches, t, True))
        other = parts(eagle_grow.GrowthSetup.make(ints, writes, table, plan, branches, t + 1, True))
    assert all(a.dtype == b.dtype and torch.equal(a.cpu(), b) for a, b in zip(got, want, strict=True))
    assert not all(a.shape == b.shape and torch.equal(a.cpu(), b) for a, b in zip(other, want))


def growth(kernels: bool, monkeypatch):
    """A captured-shape growth (3 CFG sequences, top-k 5 / 2 / 4, depths 3 / 0 / 2) of a tiny image model's EAGLE
    drafter over a random cache, with the ranking kernels or torch's ops."""
    from specgen.models.eagle import EagleNet
    from tests.image_fixtures import tiny_image_target

    monkeypatch.setattr(eagle_grow, "kernel_choice", SimpleNamespace(one_pass=lambda x: kernels))
    if kernels:
        for name in ("top_children", "beam", "kept_tree", "growth_setup"):
            monkeypatch.setattr(torch.ops.specgen, name, getattr(cuda_ops, name))
    model = tiny_image_target(0)
    net = EagleNet.from_target(model).eval()
    children = eagle_grow.Children(model.output, 2, 3.0)
    c, g = net.cfg, torch.Generator().manual_seed(3)
    k = torch.randn(1, 7, c.n_kv_heads, 64, c.hd, generator=g)
    ints = torch.tensor([[3, 4, 5], [5, 2, 4], [3, 0, 2], [12, 0, 12], [4, 5, 6], [7, 8, 9]])
    hidden = torch.randn(6, 1, c.dim, generator=g)
    with torch.inference_mode():
        return eagle_grow.static_growth(net, children, (k, k.clone()), eagle_grow.GrowPlan((8, 8, 8), 12), 2, 32,
                                        hidden, ints, torch.arange(6))


def test_a_growth_through_the_ranking_kernels_grows_torchs_trees(monkeypatch):
    """The whole growth (root children, two levels, the beam between them, the kept nodes and verify inputs) with the
    kernels in the interpreter: the trees and verify inputs torch's ops give; the control (another CFG scale for the
    kernels) grows other trees."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU's check: the interpreter runs the kernels on CPU tensors")
    want = growth(False, monkeypatch)
    got = growth(True, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    monkeypatch.setattr(cuda_ops, "top_children", lambda logits, scores, br, scale, k, *record: CHILDREN(
        logits, scores, br, 1.5, k, *record))
    assert not all(torch.equal(a, b) for a, b in zip(growth(True, monkeypatch), want))


CHILDREN = cuda_ops.top_children


def test_a_drafters_input_is_torchs_cat_of_its_embedding_and_features(device):
    """`embed_cat`: the embedding rows of the tokens and the features side by side, bit for bit (a copy), features
    read through their strides (a frontier broadcast from its root: stride 0)."""
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(40, 24, generator=g).to(device, dtype)
        tokens = torch.randint(0, 40, (3, 5), generator=g).to(device)
        feats = torch.randn(3, 1, 24, generator=g).to(device, dtype).expand(3, 5, 24)
        want = torch.cat([torch.nn.functional.embedding(tokens, weight), feats], -1)
        assert torch.equal(cuda_ops.embed_cat(weight, tokens, feats), want)


def test_a_growths_kernels_copy_none_of_their_inputs(monkeypatch):
    """A wrapper's own copy of an input (a `contiguous()` of a strided view) is a kernel inside a captured growth on
    CUDA that the CPU count cannot see (`gpu_sync_count` traces the ops through their fake kernels): the growth's
    kernels read every input through its strides (top_children's path scores: the first level's are a view of the
    record's, rows N apart), so none of the ops a wrapper runs itself is a copy; the interpreter's own are not
    counted. Failed before 1db701e (top_children's path scores `contiguous()`)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU's check: the interpreter runs the kernels on CPU tensors")
    copying = {torch.ops.aten.contiguous.default, torch.ops.aten.clone.default, torch.ops.aten.copy_.default,
               torch.ops.aten._to_copy.default}
    copies = []

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ours = [f.filename for f in traceback.extract_stack() if "/specgen/" in f.filename or "/triton/" in
                    f.filename]
            if func in copying and ours and ours[-1].endswith("native/cuda_ops.py"):
                copies.append(func)
            return func(*args, **(kwargs or {}))

    with Copies():
        growth(True, monkeypatch)
    assert not copies, copies
