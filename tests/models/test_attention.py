"""Invariant attention, both paths (torch's chunked GEMMs and the native C kernel): SDPA's values, and a query's
result independent of the forward's width, its batch and (trees) where its keys sit in the cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen import native
from specgen.models.attention import (CHUNK, NativePlan, chain_plan, in_window, invariant_attention, native_plan,
                                      plan)
from specgen.models.kernel_choice import attention_path
from specgen.models.prompt import prompt_mode


@pytest.fixture(params=["torch", "native"], autouse=True)
def backend(request, monkeypatch):
    """Every test runs on both paths; the native one needs a C compiler (CI has one)."""
    if request.param == "native" and native.library("attention") is None:
        pytest.skip("no C compiler: the native kernel is not built here")
    if request.param == "torch":
        monkeypatch.setattr(native, "library", lambda name: None)  # as without a compiler
    with torch.inference_mode():  # as decoding runs (the native path needs grad mode off)
        yield request.param


def make_plan(mask, b, s, t, h, hkv, d, dtype, start=None):
    """The backend's plan: on the native backend the kernel's for either dtype (`start`: a window's, `plan`)."""
    if native.library("attention") is not None:
        return native_plan(mask, b, s, t, h, d, dtype=dtype)
    return plan(mask, b, s, t, h, hkv, d, "cpu", dtype, start=start)


def attention(q, k, v, mask, start=None):
    b, h, s, d = q.shape
    return invariant_attention(q, k, v, make_plan(mask, b, s, k.shape[2], h, k.shape[1], d, q.dtype, start))


def two_branch_tree(prefix: int) -> torch.Tensor:
    """[1, 1, 10, prefix + 10] bool: every prefix slot, then a tree of 10 inputs, its main chain at inputs 0..4 and a
    side branch at 5..9 (each input sees itself and its ancestors)."""
    parents = [-1, 0, 1, 2, 3, -1, 5, 6, 7, 8]
    tree = torch.zeros(10, 10, dtype=torch.bool)
    for i, par in enumerate(parents):
        tree[i, i] = True
        while par >= 0:
            tree[i, par] = True
            par = parents[par]
    mask = torch.ones(1, 1, 10, prefix + 10, dtype=torch.bool)
    mask[..., prefix:] = tree
    return mask


def test_bfloat16_and_float32_on_a_cpu_take_the_native_path_where_it_is_built(backend):
    for dtype in (torch.bfloat16, torch.float32):
        assert isinstance(plan(None, 1, 1, 5, 4, 2, 16, "cpu", dtype), NativePlan) == (backend == "native")
        want = "native" if backend == "native" else "sdpa" if dtype == torch.float32 else "chunked"  # float32: SDPA
        assert attention_path(dtype, "cpu") == want
        with prompt_mode():  # a prompt prefill
            assert attention_path(dtype, "cpu") == "sdpa"
    assert not isinstance(plan(None, 1, 1, 5, 4, 2, 16, "cpu", torch.float16), NativePlan)


def case(seed=0, b=2, h=6, hkv=2, s=20, t=300, d=32, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, m, d, generator=g).to(dtype) for n, m in ((h, s), (hkv, t), (hkv, t)))
    vis = torch.zeros(b, 1, s, t, dtype=torch.bool)
    for i in range(s):
        vis[:, :, i, : t - s + 1 + i] = True  # causal after a committed prefix
    return q, k, v, vis


@pytest.mark.parametrize("t", [7, 128, 300])
def test_values_equal_sdpa_in_float32(t):
    q, k, v, vis = case(t=t, s=min(20, t))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=vis, enable_gqa=True)
    got = attention(q, k, v, vis)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 2**-7 * want.abs().max()


@pytest.mark.parametrize("h,hkv", [(4, 1), (2, 2), (72, 1)])  # GQA; plain multi-head; 72 heads on one kv head
@pytest.mark.parametrize("d", [8, 24, 80])  # head sizes off the native kernel's 16-lane blocks (a padded tail)
def test_odd_head_sizes_keep_values_and_invariance(d, h, hkv):
    q, k, v, vis = case(1, b=1, h=h, hkv=hkv, s=6, t=40, d=d)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=vis, enable_gqa=True)
    full = attention(q, k, v, vis)
    assert (full.float() - want).abs().max() < 2**-7 * want.abs().max()
    for i in range(6):
        one = attention(q[:, :, i : i + 1], k[:, :, : 35 + i], v[:, :, : 35 + i], None)
        assert torch.equal(one, full[:, :, i : i + 1]), i


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("t", [140, 300])  # 140: the forwards' key counts cross a chunk boundary (1 or 2 chunks)
def test_a_query_gets_the_same_bits_at_every_width_and_in_any_batch(seed, t, dtype):
    q, k, v, vis = case(seed, t=t, dtype=dtype)
    s, t = q.shape[2], k.shape[2]
    full = attention(q, k, v, vis)
    for w in (1, 2, 3, 5, 8):  # AR steps (w = 1, keys [0, n]) and verification forwards of w tokens
        parts = [attention(q[:, :, i : i + w], k[:, :, : t - s + i + w], v[:, :, : t - s + i + w],
                           vis[:, :, i : i + w, : t - s + i + w]) for i in range(0, s - w + 1, w)]
        got = torch.cat(parts, 2)
        assert torch.equal(got, full[:, :, : got.shape[2]]), w
    assert torch.equal(attention(q[1:], k[1:], v[1:], vis[1:]), full[1:])  # alone vs in a batch of 2
    one = attention(q[:, :, -1:], k, v, None)  # no mask (every slot visible) = the last query's mask
    assert torch.equal(one, full[:, :, -1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_forward_wider_than_a_query_block_gives_each_query_its_result_alone(dtype):
    """150 queries (the native kernel computes 64 at a time, native/attention.c QUERY_BLOCK): each query's bits are
    its AR step's."""
    q, k, v, vis = case(4, b=1, s=150, t=200, dtype=dtype)
    full = attention(q, k, v, vis)
    for i in range(0, 150, 13):
        one = attention(q[:, :, i : i + 1], k[:, :, : 51 + i], v[:, :, : 51 + i], None)
        assert torch.equal(one, full[:, :, i : i + 1]), i


def test_the_invariance_test_can_fail_on_sdpa():
    """SDPA itself is not width-invariant in bfloat16 (why models/attention.py exists)."""
    q, k, v, vis = case(0, s=24, t=200)
    s, t = 24, 200
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=vis, enable_gqa=True)
    steps = torch.cat([F.scaled_dot_product_attention(q[:, :, i : i + 1], k[:, :, : t - s + i + 1],
                                                      v[:, :, : t - s + i + 1], enable_gqa=True)
                       for i in range(s)], 2)
    assert not torch.equal(steps, full)


def test_a_query_that_sees_nothing_gets_zeros():
    q, k, v, vis = case(s=3, t=5)
    vis[0, :, 1] = False
    out = attention(q, k, v, vis)
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1])) and torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("prefix", [60, 180, 300])  # 0, 1 and 2 leading chunks shared by every query
def test_a_tree_query_gets_exactly_its_ar_result(prefix, dtype):
    """A side-branch query (its ancestors at other cache slots than AR gives them, siblings between them) gets
    bitwise the result of the same query over AR's key layout (prefix, then its ancestors in order)."""
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d, s = 9, 3, 64, 10
    q, k, v = (torch.randn(1, n, m, d, generator=g).to(dtype)
               for n, m in ((heads, s), (kv_heads, prefix + s), (kv_heads, prefix + s)))
    mask = two_branch_tree(prefix)
    tree_plan = make_plan(mask, 1, s, prefix + s, heads, kv_heads, d, dtype)
    assert isinstance(tree_plan, NativePlan) or tree_plan.shared_chunks == prefix // CHUNK
    out = invariant_attention(q, k, v, tree_plan)
    for i in range(5, s):  # each side-branch query against AR: keys = prefix + its path, contiguous
        path = [j for j in range(s) if mask[0, 0, i, prefix + j]]
        keys = list(range(prefix)) + [prefix + j for j in path]
        ar = attention(q[:, :, i : i + 1], k[:, :, keys], v[:, :, keys], None)
        assert torch.equal(ar[:, :, 0], out[:, :, i]), i


def windowed(vis: torch.Tensor, qpos: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(vis [B, 1, S, T] with the window of queries at positions qpos [B, S] over keys at slots = positions, each
    query's first visible position [B, S]) as transformer.windowed_masks makes them."""
    b, _, _, t = vis.shape
    keys = torch.arange(t).expand(b, t)
    return vis & in_window(qpos, keys, window), (qpos - (window - 1)).clamp(min=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [8, 150])  # 150: a window across a chunk boundary
def test_a_windowed_query_depends_only_on_its_window(window, dtype):
    """Sliding window: the keys a query's window leaves out add exact zeros. Its result is the same bits whatever
    those keys hold, at every width (AR steps, chains), alone or in a batch; on the list kernel also with the
    left-out keys absent. Control: the window changes the result."""
    q, k, v, vis = case(3, t=300, dtype=dtype)
    b, s, t = 2, q.shape[2], 300
    qpos = (t - s + torch.arange(s)).expand(b, s)
    wvis, start = windowed(vis, qpos, window)
    full = attention(q, k, v, wvis, start)
    assert not torch.equal(full, attention(q, k, v, vis))
    unseen = ~wvis.any(2)[:, 0]  # [B, T]: the slots no query's window holds
    k2, v2 = k.clone(), v.clone()
    k2.transpose(1, 2)[unseen], v2.transpose(1, 2)[unseen] = 7.0, -3.0  # other keys and values where none looks
    assert torch.equal(attention(q, k2, v2, wvis, start), full)
    for w in (1, 2, 5):  # AR steps and chains of w tokens: keys up to the last one's slot
        parts = [attention(q[:, :, i : i + w], k[:, :, : t - s + i + w], v[:, :, : t - s + i + w],
                           wvis[:, :, i : i + w, : t - s + i + w], start[:, i : i + w]) for i in range(0, s - w + 1, w)]
        got = torch.cat(parts, 2)
        assert torch.equal(got, full[:, :, : got.shape[2]]), w
    assert torch.equal(attention(q[1:], k[1:], v[1:], wvis[1:], start[1:]), full[1:])  # alone vs in a batch of 2
    if native.library("attention") is None:  # chunked: AR's layout is the slots', as a static step's chain plan reads
        assert torch.equal(invariant_attention(q, k, v, chain_plan(wvis, b, s, t, 6, 2, 32)), full)
    if native.library("attention") is not None:  # lists: the last query's window alone, no key before it
        lo = t - window
        alone = attention(q[:, :, -1:], k[:, :, lo:], v[:, :, lo:], None)
        assert torch.equal(alone, full[:, :, -1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [3, 7, 140])  # 3: a window inside the branch (no committed key in it)
def test_a_windowed_tree_query_gets_exactly_its_ar_result(window, dtype):
    """A side-branch query of a tree over a sliding window (its window by positions: the prefix's slots and its
    ancestors at slots past its siblings) gets bitwise its AR step's result: AR's cache holds the same keys at slots
    = positions, windowed there."""
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, s, prefix = 6, 2, 32, 10, 180
    q, k, v = (torch.randn(1, n, m, d, generator=g).to(dtype)
               for n, m in ((heads, s), (kv_heads, prefix + s), (kv_heads, prefix + s)))
    mask, depth = two_branch_tree(prefix), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    qpos = (prefix + depth)[None]  # [1, S]
    keys = torch.cat([torch.arange(prefix), prefix + depth])[None]  # [1, T]: each slot's position
    wmask = mask & in_window(qpos, keys, window)
    out = attention(q, k, v, wmask, (qpos - (window - 1)).clamp(min=0))
    for i in range(5, s):  # each side-branch query against AR: keys = prefix + its path at slots = positions
        slots = list(range(prefix)) + [prefix + j for j in range(s) if mask[0, 0, i, prefix + j]]
        p = prefix + int(depth[i])
        ar_vis, ar_start = windowed(torch.ones(1, 1, 1, p + 1, dtype=torch.bool), torch.tensor([[p]]), window)
        ar = attention(q[:, :, i : i + 1], k[:, :, slots], v[:, :, slots], ar_vis, ar_start)
        assert torch.equal(ar[:, :, 0], out[:, :, i]), i


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_keys_read_once_for_every_query_change_no_bit(backend, dtype):
    """The kernel reads the slots every query of a row sees (`shared`) once for all of them: the result is bitwise
    what it is when each query reads its whole list itself (shared = 0), for ragged rows and a tree alike."""
    if backend != "native":
        pytest.skip("the native kernel's read sharing")
    q, k, v, vis = case(b=3, s=6, t=90, d=64, dtype=dtype)
    vis[1, :, :, :20] = False  # row 1: its lists start past slot 0 (nothing shared)
    vis[2, :, 3, 84] = False  # row 2: a tree (query 3 skips a sibling)
    p = native_plan(vis, 3, 6, 90, 6, 64, dtype=dtype)
    assert p.shared.tolist() == [85, 0, 84]
    shared = invariant_attention(q, k, v, p).clone()
    p.shared.zero_()
    assert torch.equal(invariant_attention(q, k, v, p), shared)


@pytest.mark.parametrize("seed", range(4))
def test_native_plan_lists_equal_a_stable_sort_of_the_mask(backend, seed):
    """attention.c's specgen_plan against the torch ops it replaced: idx = a stable sort of the hidden flags (visible
    slots ascending, then hidden ones), count = visible slots, shared = the leading run of slots every query of a
    row sees; over random trees, ragged prefixes, a row that sees nothing and a broadcast mask."""
    if backend != "native":
        pytest.skip("the native kernel's plan")
    g = torch.Generator().manual_seed(seed)
    b, s, t = 4, 7, 40
    vis = torch.rand(b, 1, s, t, generator=g) < 0.6
    vis[:2, :, :, :12] = True  # rows 0-1: a committed prefix every query sees
    vis[2, :, 0] = False  # row 2: nothing shared
    vis[3, 0, 5] = False  # row 3: query 5 sees no key at all (shared 0)
    for mask, rows in ((vis, b), (vis[:1], 3)):  # a [1, 1, S, T] mask broadcast over 3 rows
        p = native_plan(mask, rows, s, t, 2, 8)
        seen = mask[:, 0].expand(rows, s, t)
        idx = torch.sort((~seen).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        count = seen.sum(-1, dtype=torch.int32)
        lead = seen.to(torch.int32).cummin(-1).values.sum(-1)  # [rows, S]: leading visible run
        assert torch.equal(p.idx, idx) and torch.equal(p.count, count)
        assert torch.equal(p.shared, lead.amin(-1).to(torch.int32))
    assert native_plan(vis, b, s, t, 2, 8).shared[:2].min() >= 12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_the_fused_native_layer_equals_rotate_write_and_attend(backend, layout, dtype):
    """native_self_attention (RoPE, cache write and attention in one call) is bitwise the unfused steps: torch's
    `rotate` in the same dtype, `KVCache.write` and the attention kernel, over ragged rows."""
    if backend != "native":
        pytest.skip("the fused layer exists on the native path only")
    from specgen.models.cache import KVCache
    from specgen.models.attention import native_self_attention
    from specgen.models.rope import rotate, rotation

    g = torch.Generator().manual_seed(3)
    b, h, hkv, s, d, lengths = 2, 6, 2, 3, 32, [9, 5]
    qkv = torch.randn(b, s, (h + 2 * hkv) * d, generator=g).to(dtype)
    rot = rotation(torch.randn(b, s, d // 2, 2, generator=g).to(dtype), layout)
    caches = [KVCache.allocate(1, b, hkv, 16, d, dtype) for _ in range(2)]
    caches[0].k.normal_(generator=g), caches[0].v.normal_(generator=g)  # stale slots past the lengths too
    for c in caches:
        c.k.copy_(caches[0].k), c.v.copy_(caches[0].v)
        c.lengths = list(lengths)
    mask = caches[0].prefix_mask(s, None)
    t = mask.shape[-1]
    fused = native_self_attention(qkv, rot, *caches[0].layers[0], native_plan(mask, b, s, t, h, d, lengths, dtype))
    x = qkv.view(b, s, h + 2 * hkv, d).transpose(1, 2)
    qk = rotate(x[:, : h + hkv], rot)
    k, v = caches[1].write(0, qk[:, h:], x[:, h + hkv :])
    want = invariant_attention(qk[:, :h], k, v, native_plan(mask, b, s, t, h, d, dtype=dtype))
    assert torch.equal(fused.view(b, s, h, d).transpose(1, 2), want)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
