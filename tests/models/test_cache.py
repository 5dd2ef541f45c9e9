"""Cached logits equal uncached; committing a tree path leaves the cache equal to an AR-built one."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.draft import Draft
from specgen.decoding.tree import DraftTree
from specgen.decoding.verify import host_batch
from specgen.models.cache import KVCache
from tests.conftest import tiny_model


def test_cached_equals_uncached():
    model = tiny_model(0)
    tokens = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(20).unsqueeze(0)
    full, _ = model(tokens, positions)
    cache = model.new_cache(1, 64)
    step_logits = []
    for i in range(0, 20, 5):  # chunks of 5 with a causal mask, then commit
        logits, _ = model(tokens[:, i : i + 5], positions[:, i : i + 5], cache)
        cache.commit(0, list(range(5)))
        step_logits.append(logits)
    torch.testing.assert_close(torch.cat(step_logits, 1), full, atol=1e-5, rtol=1e-5)


def test_tree_commit_equals_ar_cache():
    model = tiny_model(1)
    prefix = torch.tensor([[5, 9, 2, 7]])
    tree = DraftTree((-1, -1, 0, 0, 1, 3))  # root -> {0, 1}; 0 -> {2, 3}; 1 -> 4; 3 -> 5
    draft_tokens = torch.tensor([[11, 12, 13, 14, 15, 16]])
    path = tree.paths()[-1]  # the path to leaf 5
    assert tree.paths() == [[0, 2], [1, 4], [0, 3, 5]]

    cache = model.new_cache(1, 32)
    model(prefix[:, :-1], torch.arange(3).unsqueeze(0), cache)
    cache.commit(0, [0, 1, 2])
    batch = host_batch([7], [Draft(tuple(draft_tokens[0].tolist()), tree)], [3]).to("cpu")  # root 7 at position 3
    tree_logits, _ = model(batch.tokens, batch.positions, cache, batch.tree_mask[0])
    cache.commit(0, [0] + [i + 1 for i in path])

    seq = torch.cat([prefix, draft_tokens[:, path]], 1)  # [1, 7]
    ref_cache = model.new_cache(1, 32)
    ref_logits, _ = model(seq, torch.arange(7).unsqueeze(0), ref_cache)
    ref_cache.commit(0, list(range(7)))
    assert cache.lengths == ref_cache.lengths == [7]
    torch.testing.assert_close(cache.k[:, :, :, :7], ref_cache.k[:, :, :, :7], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :7], ref_cache.v[:, :, :, :7], atol=1e-5, rtol=1e-5)
    # the tree forward's logits on the path equal the AR logits at the same positions
    torch.testing.assert_close(tree_logits[0, [0] + [i + 1 for i in path]], ref_logits[0, 3:], atol=1e-5, rtol=1e-5)
    # and a next step on the committed cache matches the reference
    nxt = torch.tensor([[3]])
    a, _ = model(nxt, torch.tensor([[7]]), cache)
    b, _ = model(nxt, torch.tensor([[7]]), ref_cache)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rollback_and_per_row_lengths():
    model = tiny_model(2)
    cache = model.new_cache(2, 32)
    seqs = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    model(seqs[:, :4], torch.arange(4).expand(2, 4), cache)
    cache.commit(0, [0, 1, 2, 3])
    cache.commit(1, [0, 1])  # row 1 keeps only 2 tokens: rows now differ
    assert cache.lengths == [4, 2]
    # one more token per row at different slots: must equal the uncached logits of each row's sequence
    step = torch.stack([seqs[0, 4:5], seqs[1, 2:3]])
    logits, _ = model(step, torch.tensor([[4], [2]]), cache)
    for row, n in ((0, 5), (1, 3)):
        ref, _ = model(seqs[row : row + 1, :n], torch.arange(n).unsqueeze(0))
        torch.testing.assert_close(logits[row, 0], ref[0, -1], atol=1e-5, rtol=1e-5)
    cache.rollback(0, 2)
    assert cache.lengths == [2, 2]


def test_one_node_mask_over_ragged_rows_is_the_tree_masks_one_node_case():
    """A batched AR step over rows of different lengths takes a 3-op mask; it must be what the general pending-node
    mask gives for a one-node tree (a two-node chain's first row), with hidden key slots still hidden."""
    cache = tiny_model(0).new_cache(3, 16)
    cache.lengths = [5, 2, 9]
    one = cache.prefix_mask(1, None)  # [B, 1, 1, T]
    two = cache.prefix_mask(2, None)  # [B, 1, 2, T + 1]: node 0 of a chain sees exactly what a lone node sees
    assert one.shape == (3, 1, 1, 10)
    assert torch.equal(one[:, :, 0], two[:, :, 0, :10])
    assert torch.equal(one[:, 0, 0].sum(-1), torch.tensor([6, 3, 10]))
    cache.key_mask = torch.ones(3, 16, dtype=torch.bool)
    cache.key_mask[:, 1] = False  # a hidden condition slot (t2i padding)
    hidden = cache.prefix_mask(1, None)
    assert not hidden[:, 0, 0, 1].any() and torch.equal(hidden[:, 0, 0, 2:], one[:, 0, 0, 2:])


def test_a_commit_refuses_nodes_out_of_path_order():
    """A keep is a tree path (parents precede children), ascending: the one-launch commit's block order relies on it."""
    cache = KVCache.allocate(1, 1, 1, 16, 2)
    cache.lengths = [3]
    with pytest.raises(ValueError, match="ascending"):
        cache.commit_seqs({0: [0, 2, 1]}, 1)
    cache.commit_seqs({0: [0, 1, 3]}, 1)
    assert cache.lengths == [6]
