"""LANTERN: pooling never moves more than delta of mass; delta 0 is the lossless rule; neighbour cache."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specgen.decoding.accept import accept_greedy
from specgen.decoding.accept_relaxed import accept_lantern, pooled
from specgen.decoding.draft import Draft
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.tree import DraftTree
from specgen.image.neighbours import compute_neighbours, neighbour_table


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(2, 40), st.integers(1, 10), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_pooling_moves_at_most_delta(v, k, delta, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(v, generator=g) ** 3
    p = p / p.sum()
    x = int(torch.randint(0, v, (), generator=g))
    nbrs = torch.tensor([i for i in torch.randperm(v, generator=g).tolist() if i != x][:k])
    mass, j = pooled(p, nbrs, delta)
    relaxed = p.clone()
    relaxed[x] += mass
    relaxed[nbrs[:j]] = 0.0
    tv = 0.5 * float((relaxed - p).abs().sum())
    assert tv <= delta + 1e-6 and abs(tv - mass) < 1e-5
    assert abs(float(relaxed.sum()) - 1.0) < 1e-5
    assert j == len(nbrs) or float(p[nbrs[: j + 1]].sum()) > delta  # j is maximal


def test_delta_zero_greedy_equals_lossless_rule():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 16, generator=g) * 3
    draft = Draft((3, 5, 1, 2, 9, 4), DraftTree((-1, -1, 0, 0, 2, 4)))
    nbrs = compute_neighbours(torch.randn(16, 4, generator=g), 5)
    relaxed = accept_lantern(draft, logits, SamplingParams(), None, nbrs, 0.0)
    exact = accept_greedy(draft, logits.argmax(-1).tolist())
    assert relaxed.tokens == exact.tokens


def test_relaxation_accepts_a_neighbour_of_the_argmax():
    p = torch.tensor([0.30, 0.25, 0.05, 0.40])  # argmax 3; draft 1 whose neighbour 3 ... pool 0 into 1
    logits = torch.log(torch.stack([p, p]))
    nbrs = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 0, 3], [0, 1, 2]])
    draft = Draft((1,), DraftTree((-1,)))
    assert accept_lantern(draft, logits, SamplingParams(), None, nbrs, 0.1).num_accepted == 0
    assert accept_lantern(draft, logits, SamplingParams(), None, nbrs, 0.3).num_accepted == 1  # 0.25 + 0.30 > 0.40


def test_neighbour_table_is_cached_by_codebook_hash(specgen_home):
    cb = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    t1 = neighbour_table(cb, 4)
    files = list((specgen_home / "artefacts" / "neighbours").glob("*.safetensors"))
    assert len(files) == 1 and t1.shape == (32, 4)
    assert (neighbour_table(cb, 4) == t1).all()
    d = torch.cdist(cb, cb)
    assert all(int(t1[i, 0]) == int(d[i].clone().fill_(0).add(d[i]).index_fill(0, torch.tensor([i]), 1e9).argmin())
               for i in range(32))


def test_a_neighbour_table_whose_cache_folder_cannot_be_written_is_computed_with_one_warning(specgen_home):
    specgen_home.mkdir(parents=True, exist_ok=True)
    (specgen_home / "artefacts").write_text("a file where the cache folder goes")
    cb = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="neighbour table is not cached") as seen:
        table = neighbour_table(cb, 4)
    assert len(seen) == 1 and torch.equal(table, compute_neighbours(cb, 4))
