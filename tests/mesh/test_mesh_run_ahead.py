"""XSpecMesh `run_ahead`: several chain steps a host read, each step's verdict and next chain made on the device."""

from __future__ import annotations

import dataclasses

import pytest

from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from specgen.methods.xspecmesh_ahead import ChainAhead
from specgen.models import graphs
from tests.conftest import host_reads_inside
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model
from tests.models.test_graphs import capture  # noqa: F401  (fixture: static steps uncaptured, or traced)

CHAIN = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1, vertex_lookup=True)


@pytest.fixture(scope="module")
def shipped():
    """The shipped tiny backbone and heads (the heads accept: the device's vertex memory and chains are exercised),
    three clouds, and greedy AR's meshes of them at batch 2."""
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", graphs="off")
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 3)]
    ar = MeshDecoder(loaded.decoder.model, None, loaded.decoder.eos_id)
    return loaded.decoder, clouds, [r.tokens for r in ar.generate_batch(clouds, SamplingParams(), 512, batch_size=2)]


@pytest.mark.parametrize("vertex", [True, False])
def test_run_ahead_decodes_ar_with_the_per_step_chains_verdicts(shipped, vertex):
    """Greedy AR's meshes at batch 2 over three clouds (an admission into a freed slot, a compaction), and each
    step's accepted candidates those of the chain read every step (the device's vertex memory and next chains are
    the host's): the last step of a mesh aside, where the host cuts its chain after an EOS candidate."""
    decoder, clouds, ar = shipped
    opts = dataclasses.replace(CHAIN, vertex_lookup=vertex)
    each = decoder.generate_batch(clouds, SamplingParams(), 512, opts, batch_size=2)
    for k in (2, 5):
        ahead = decoder.generate_batch(clouds, SamplingParams(), 512, dataclasses.replace(opts, run_ahead=k),
                                       batch_size=2)
        assert [r.tokens for r in ahead] == ar
        assert [r.stats.accepted[:-1] for r in ahead] == [r.stats.accepted[:-1] for r in each]
    assert sum(sum(r.stats.accepted) for r in each) > 20  # the heads and the memory were right often


def test_run_ahead_reads_the_host_once_a_loop_step(shipped, monkeypatch):
    """No host read inside a loop step's verify steps (the CPU's RoPE bound check aside: on a GPU an assert queued on
    the device); the loop step's one read is `settle`'s."""
    decoder, clouds, ar = shipped
    reads, calls = host_reads_inside(monkeypatch, ChainAhead)
    got = decoder.generate_batch(clouds[:1], SamplingParams(), 512, dataclasses.replace(CHAIN, run_ahead=4))
    assert got[0].tokens == ar[0] and len(calls) > 5 and reads == []


@pytest.mark.parametrize("capture", ["static", "traced"], indirect=True)
def test_run_ahead_through_static_steps_decodes_ar(capture):  # noqa: F811  (the fixture)
    """The backbone's and heads' static steps (traced: as captured; `advance` a replay too, rerun by the capture's
    warm-up and replay without effect), batch 2 then 1 over three clouds: greedy AR's tokens, every verify a replay."""
    clouds = procedural_clouds(range(11, 14))
    ar = [r.tokens for r in MeshDecoder(tiny_mesh_model(), None).generate_batch(clouds, SamplingParams(), 40,
                                                                                batch_size=2)]
    decoder = MeshDecoder(tiny_mesh_model(), tiny_heads())
    graphs.attach(decoder.model.decoder, "on", capture=capture)
    graphs.attach(decoder.heads, "on", capture=capture)
    for batch in (2, 1):  # another width: its own held state, and captures that write it
        got = decoder.generate_batch(clouds, SamplingParams(), 40, dataclasses.replace(CHAIN, run_ahead=3),
                                     batch_size=batch)
        assert [r.tokens for r in got] == ar, batch
    g = decoder.model.decoder.graphs
    assert g.eager_calls == 0
    assert any(isinstance(key, tuple) and key[0] == "chain-ahead" for key in g.graphs)  # `advance` replayed


@pytest.mark.parametrize("change", [dict(criterion="threshold"), dict(candidate_tree="2,1"), dict(min_path_prob=0.1),
                                    dict(vertex_lookup=False, lookup=2), dict(budget="auto")])
def test_run_ahead_refuses_what_is_not_the_lossless_chain(change):
    with pytest.raises(UsageError, match="run_ahead"):
        dataclasses.replace(CHAIN, run_ahead=2, **change)


def test_run_ahead_refuses_sampling(shipped):
    decoder, clouds, _ = shipped
    with pytest.raises(UsageError, match="run_ahead .* needs --temperature 0"):
        decoder.generate_batch(clouds[:1], SamplingParams(1.0), 8, dataclasses.replace(CHAIN, run_ahead=2))


def test_run_ahead_refuses_history_heads():
    decoder = MeshDecoder(tiny_mesh_model(), tiny_heads("ca", history=2))
    with pytest.raises(UsageError, match="run_ahead .* heads without a history window"):
        decoder.generate_batch(procedural_clouds([11]), SamplingParams(), 8, dataclasses.replace(CHAIN, run_ahead=2))
