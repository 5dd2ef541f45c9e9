"""Host reads of a lossless XSpecMesh step (each idles a GPU): the batched judge's one copy, the heads' riding it."""

from __future__ import annotations

import dataclasses
import itertools
import traceback
from types import SimpleNamespace

import pytest
import torch

from specgen.decoding import loop
from specgen.decoding.draft_verify import DraftVerify, judge
from specgen.decoding.sampling import SamplingParams
from specgen.methods import xspecmesh, xspecmesh_pool
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from specgen.methods.xspecmesh_pool import XSpecMeshPool
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model
from tests.mesh.test_mesh_xspecmesh import one_thread, setup  # noqa: F401  (fixtures: the tiny model, 1 thread)

GREEDY = SamplingParams(0.0)
SAMPLED = SamplingParams(1.0, 50, 0.95)
LOSSLESS = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)


def step_reads(setup, monkeypatch, opts: XSpecMeshOptions = LOSSLESS, heads=None) -> list[int]:
    """Host reads (tolist, item, bool, int, float, cpu, numpy of any tensor) of each greedy step after the first,
    from one plan to the next (the first step's heads have no earlier accept read to ride)."""
    model, pc = setup
    log: list[str] = []

    def counted(real):
        def read(*a, **k):  # the CPU's RoPE bound check reads (on a GPU: an assert queued on the device)
            log.extend("r"[: all(f.name != "forward_rotation" for f in traceback.extract_stack())])
            return real(*a, **k)

        return read

    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    monkeypatch.setattr(DraftVerify, "plan", lambda *a, _r=DraftVerify.plan, **k: log.append("P") or _r(*a, **k))
    MeshDecoder(model, heads or tiny_heads()).generate_batch([pc], GREEDY, 60, opts)
    steps = "".join(log).split("P")[2:-1]  # whole steps only: the last ends with the loop's end
    assert len(steps) > 5
    return [step.count("r") for step in steps]


def test_a_lossless_greedy_step_reads_once_for_its_verdicts_and_once_for_its_heads(setup, monkeypatch):
    assert max(step_reads(setup, monkeypatch)) == 2


def test_read_ahead_heads_ride_the_accept_read(setup, monkeypatch):
    """Where the heads run for every verify position (a GPU: ONE_READ), a step reads the host once; history heads
    (windows of unequal lengths) run in `propose` there too."""
    monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset({"cpu"}))
    path_cut = dataclasses.replace(LOSSLESS, min_path_prob=0.2)  # probabilities in the same copy
    assert max(step_reads(setup, monkeypatch)) == 1
    assert max(step_reads(setup, monkeypatch, path_cut, tiny_heads("mlp", token_input=True))) == 1
    assert max(step_reads(setup, monkeypatch, heads=tiny_heads(history=3))) == 2


def test_the_read_count_sees_a_rule_that_reads_per_candidate(setup, monkeypatch):
    """The control: a rule that reads p(x) of each candidate on the host (as the walk before the batched judge did)."""

    def per_candidate(draft, logits, params, g):
        for c, x in enumerate(draft.tokens):
            float(logits[c, x])
        return judge(draft, logits, params, g)

    monkeypatch.setattr(xspecmesh, "mesh_rule", lambda *_: per_candidate)
    assert max(step_reads(setup, monkeypatch)) > 3


def record_drafts(monkeypatch) -> list[list[tuple]]:
    """Each XSpecMeshPool.propose's draft tokens per row, appended to the list's last entry."""
    drafts: list[list[tuple]] = []
    real = XSpecMeshPool.propose

    def propose(self, *a):
        out = real(self, *a)
        drafts[-1].append(tuple(d.tokens for d in out))
        return out

    monkeypatch.setattr(XSpecMeshPool, "propose", propose)
    return drafts


@pytest.mark.parametrize("kind", ["ca", "mlp", "ca+token", "mlp+token", "ca+vertex", "ca+cut", "ca+d2", "ca+tree",
                                  "ca+vertex+tree"])
def test_read_ahead_drafts_what_propose_drafts(setup, monkeypatch, kind):
    """The heads run ahead on each verify position draft, at the accepted one, the very candidates `propose` computes
    after the verdict (a candidate tree's: at the node the accepted path ends at); the mesh is greedy AR's."""
    model, pc = setup
    heads = tiny_heads(kind.split("+")[0], scramble=False, token_input="token" in kind)
    opts = dataclasses.replace(LOSSLESS, vertex_lookup="vertex" in kind, min_path_prob=1e-9 * ("cut" in kind),
                               num_heads=2 * ("d2" in kind), candidate_tree="3,2,1" if "tree" in kind else "")
    drafts = record_drafts(monkeypatch)
    results = []
    for ahead in ((), ("cpu",)):
        monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset(ahead))
        drafts.append([])
        results.append(MeshDecoder(model, heads).generate_batch([pc], GREEDY, 80, opts)[0])
    assert drafts[0] == drafts[1] and sum(results[0].stats.accepted) > 0
    assert results[0].tokens == results[1].tokens == MeshDecoder(model).generate_batch([pc], GREEDY, 80)[0].tokens


@pytest.mark.parametrize("budget", ["fixed", "auto", "tree"])
def test_read_ahead_in_a_batch_drafts_what_propose_drafts(monkeypatch, budget):
    """Rows of different verify widths (padded columns), rows admitted into freed slots, and (auto) AR steps; (tree)
    candidate trees of different sizes. Each phase of a step is timed 1 ms: `auto` sizes drafts by measured step
    times, which must not differ by run."""
    model, clouds = tiny_mesh_model(), procedural_clouds(range(11, 16))
    tree = "2,2,1" if budget == "tree" else ""
    heads = tiny_heads(scramble=False, token_input=True)
    opts = dataclasses.replace(LOSSLESS, budget="fixed" if tree else budget, candidate_tree=tree,
                               vertex_lookup=bool(tree))
    drafts = record_drafts(monkeypatch)
    meshes = []
    for ahead in ((), ("cpu",)):
        monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=itertools.count(0, 1e-3).__next__))
        monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset(ahead))
        drafts.append([])
        meshes.append([r.tokens for r in MeshDecoder(model, heads).generate_batch(clouds, GREEDY, 50, opts,
                                                                                   batch_size=3)])
    assert drafts[0] == drafts[1] and meshes[0] == meshes[1]
    assert meshes[0] == [r.tokens for r in MeshDecoder(model).generate_batch(clouds, GREEDY, 50)]
