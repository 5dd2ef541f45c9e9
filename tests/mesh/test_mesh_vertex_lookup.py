"""Vertex lookup candidates (beyond XSpecMesh): the memory's pairs, its proposals, and its place in the loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from tests.mesh.mesh_fixtures import tiny_heads, tiny_mesh_model
from tests.mesh.test_mesh_xspecmesh import SAMPLED, run, setup  # noqa: F401  (setup is a fixture)

TOK = BPTTokenizer()
BENCH_RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*/bench-meshes*.yaml"))
OFF, SPECIAL, EOS = TOK.offset_base, TOK.special_base, TOK.eos_id  # 512, 4608, 5120


def heads_stub(tokens: list[int]):
    """A `heads()` callable returning fixed head tokens and counting its calls."""
    calls: list[int] = []

    def heads() -> list[int]:
        calls.append(1)
        return tokens

    return heads, calls


def test_memory_pairs_blocks_with_the_offset_that_followed_them_latest():
    m = VertexMemory()
    m.read([7, OFF + 1, OFF + 2, 9, OFF + 3, SPECIAL + 7, OFF + 4, 9])  # 7's latest offset is OFF + 4 (as a centre)
    assert m.offsets == {7: OFF + 4, 9: OFF + 3}
    m.read([7, OFF + 1, OFF + 2, 9, OFF + 3, SPECIAL + 7, OFF + 4, 9, OFF + 5])  # the pair across the old end counts
    assert m.offsets[9] == OFF + 5 and m.read_upto == 9


def test_memory_ignores_pairs_that_are_not_block_then_offset():
    m = VertexMemory()
    m.read([OFF + 1, OFF + 2, 3, 4, OFF + 6, EOS])  # offset->offset, block->block, offset->EOS
    assert m.offsets == {4: OFF + 6}


def test_propose_offsets_after_known_blocks_and_head_tokens_elsewhere():
    m = VertexMemory()
    m.read([3, OFF + 30, 5, OFF + 50])
    heads, calls = heads_stub([5, 99, 3, 77])
    # x = block 3 (known): its offset; then head 2's token 99 (a block with no offset yet) -> head 3's token 3
    # (block 3 again) -> its offset, not head 4's 77
    assert m.propose(3, heads, 4) == [OFF + 30, 99, 3, OFF + 30]
    assert m.propose(SPECIAL + 5, heads, 2) == [OFF + 50, 99]  # a special block looks up its plain block
    assert m.propose(OFF + 1, heads, 3) == [5, OFF + 50, 3]  # after an offset: the head's block, then lookup


def test_heads_run_only_when_a_position_needs_them():
    m = VertexMemory()
    m.read([3, OFF + 30])
    heads, calls = heads_stub([1, 2])
    assert m.propose(3, heads, 1) == [OFF + 30] and not calls
    m.propose(OFF + 30, heads, 1)
    assert len(calls) == 1


def test_vertex_lookup_changes_the_draft_not_the_rule(setup):  # noqa: F811
    """Accept-nothing is still AR sampling with the same seed and greedy is still greedy AR."""
    model, pc = setup
    on = XSpecMeshOptions(vertex_lookup=True)
    assert run(model, tiny_heads(), pc, SAMPLED, XSpecMeshOptions(delta=1.0, vertex_lookup=True)).tokens == \
        run(model, None, pc, SAMPLED).tokens
    assert run(model, tiny_heads(), pc, SamplingParams(0.0), on).tokens == run(model, None, pc, SamplingParams(0.0)).tokens


def test_loop_feeds_the_memory_the_mesh_so_far_and_proposes_after_x(setup, monkeypatch):  # noqa: F811
    """Each step the memory reads the committed tokens + x_{s*} and proposes the D candidates after x_{s*}."""
    model, pc = setup
    seen, propose = [], VertexMemory.propose
    monkeypatch.setattr(VertexMemory, "propose",
                        lambda self, last, heads, d: seen.append((self.read_upto, last)) or propose(self, last, heads, d))
    res = run(model, tiny_heads(), pc, SamplingParams(0.0), XSpecMeshOptions(vertex_lookup=True), n=40)
    # every step proposes but the last, which has no room for a draft (budget 0: the heads are not run)
    assert seen[0] == (1, res.tokens[0]) and len(seen) >= res.stats.steps - 1
    assert all(res.tokens[n - 1] == last for n, last in seen)  # x_{s*} is the newest token read
    assert all(a < b for (a, _), (b, _) in zip(seen, seen[1:]))


def test_vertex_lookup_options_are_checked():
    with pytest.raises(UsageError, match="exclusive"):
        XSpecMeshOptions(lookup=1, vertex_lookup=True)
    assert "vertex lookup" in XSpecMeshOptions(vertex_lookup=True).label()
    torch.manual_seed(0)
    kwargs = tiny_mesh_model().builder_kwargs()
    kwargs["decoder"] = {**kwargs["decoder"], "vocab_size": 300}
    from specgen.models.mesh import MeshGPT

    other = MeshGPT(**kwargs).eval()
    with pytest.raises(UsageError, match="BPT"):
        MeshDecoder(other, tiny_heads()).generate_batch([torch.zeros(64, 6)], SamplingParams(0.0), 8,
                                                        XSpecMeshOptions(vertex_lookup=True))


@pytest.mark.parametrize("path", BENCH_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_mesh_benchmark_recipes_build_their_rows(path):
    """Every mesh benchmark recipe loads and names valid XSpecMesh options for each of its rows."""
    from specgen.config import load_config
    from specgen.eval.mesh_bench import MeshBenchConfig, variants

    assert len(BENCH_RECIPES) >= 4  # tiny, tiny batch, small, full; the sweeps are overrides (tests/test_recipes.py)
    cfg = load_config(MeshBenchConfig, path, ["device=cpu"])  # full recipes name cuda, refused where there is none
    rows = variants(cfg)
    assert rows[0].label == "ar" and len({v.label for v in rows}) == len(rows)


def test_held_out_scores_the_last_label_rows_teacher_forced(tmp_path):
    """The recipes' held-out helper: the last rows, trimmed to their longest sequence, one pass of the heads' backbone."""
    from safetensors.torch import save_file

    from specgen.eval.mesh_labels import held_out
    from tests.mesh.mesh_fixtures import NUM_POINTS, register_tiny

    register_tiny("tiny-mesh", "tiny-heads")
    tokens = torch.full((3, 9), -1, dtype=torch.long)
    tokens[0, :9], tokens[1, :4], tokens[2, :6] = torch.arange(9), torch.tensor([3, OFF + 1, 3, EOS]), 7
    path = tmp_path / "labels.safetensors"
    save_file({"pcs": torch.randn(3, NUM_POINTS, 6), "tokens": tokens}, str(path))
    ho = held_out(str(path), "tiny-heads", 2)
    assert torch.equal(ho.tokens, tokens[1:, :6]) and ho.logits.shape == (2, 6, 5121)
    assert ho.hidden.shape[:2] == (2, 6) and ho.heads.num_heads == 3


def test_known_rows_say_from_which_row_the_memory_proposes_each_position():
    seq = [3, OFF + 30, 5, OFF + 50, 3, OFF + 31, SPECIAL + 5, OFF + 50, 3]
    rows = VertexMemory().known_rows(seq)
    # position 5 follows block 3, whose first pair (3, OFF+30) ends at index 1: from row 1 on, the memory proposes it;
    # position 7 follows a special 5 (plain block 5, pair ending at 3); position 1 and 3 complete first pairs
    assert rows == [9, 9, 9, 9, 9, 1, 9, 3, 9]
    for i in range(len(seq)):  # the same facts, from the memory the loop keeps: read seq[:i + 1], propose after t - 1
        m = VertexMemory()
        m.read(seq[: i + 1])
        for t in range(i + 1, len(seq)):
            b = m.block_id(seq[t - 1])
            assert (b in m.offsets) == (rows[t] <= i)


def test_skip_known_offsets_masks_only_the_targets_the_memory_supplies():
    from specgen.train.heads import heads_loss, known_rows

    tokens = torch.tensor([[3, OFF + 30, 5, OFF + 50, 3, OFF + 30, 7, -1]])
    known = known_rows(tokens)
    assert known.tolist() == [[8, 8, 8, 8, 8, 1, 8, 8]]
    heads = tiny_heads(num_heads=2, scramble=False)
    model = tiny_mesh_model()
    hidden, cond = torch.randn(1, 8, 32), torch.randn(1, 8, 32)
    out = model.decoder.output
    full, _ = heads_loss(heads, hidden, cond, tokens, out, 0.8)
    skipped, _ = heads_loss(heads, hidden, cond, tokens, out, 0.8, known=known)
    never = torch.full_like(known, 8)
    same, _ = heads_loss(heads, hidden, cond, tokens, out, 0.8, known=never)
    torch.testing.assert_close(same, full)  # nothing known: the paper's loss
    assert not torch.allclose(skipped, full)  # position 5 dropped for heads 1 (row 4 >= 1) and 2 (row 3 >= 1)
