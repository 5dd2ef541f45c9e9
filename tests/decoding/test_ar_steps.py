"""`ar`'s step policy (`ArSteps`): the draft-verify of the empty draft's tokens, greedy and sampled; with run_ahead K, K
AR steps a host read decode AR's tokens, greedy and sampled, eagerly and as graph replays; refusals."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from specgen.decoding.ar_steps import ArSteps
from specgen.decoding.budget import FixedBudget
from specgen.decoding.draft_verify import DraftVerify, judge
from specgen.decoding.loop import decode_batch
from specgen.decoding.pool import EachRow
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.generate.mesh import MeshGenConfig
from specgen.generate.text import TextGenConfig
from specgen.image.target import CFGTarget
from specgen.mesh.target import MeshTarget
from specgen.methods import run_batch
from specgen.methods.options import XSpecMeshOptions
from specgen.methods.text import EmptyDrafter
from specgen.methods.xspecmesh import MeshDecoder
from specgen.methods.xspecmesh_pool import mesh_rule
from specgen.models import graphs
from specgen.request import parse_request
from tests.conftest import host_reads_inside, method_drafter, tiny_model
from tests.decoding.test_batched import ragged_prompts
from tests.image.helpers import tiny_image_gpt
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_mesh_model
from tests.models.test_graphs import static_target, traced


def decode(target, prompts, n: int, run_ahead: int = 1, stop=(), batch_size: int = 0, params=SamplingParams()):
    streamed = {i: [] for i in range(len(prompts))}
    res = run_batch(target, lambda i: method_drafter("ar", run_ahead=run_ahead), prompts, n, params, stop,
                    generators=seeded(len(prompts)), batch_size=batch_size,
                    on_tokens=lambda i, toks: streamed[i].extend(toks))
    assert [streamed[i] for i in range(len(prompts))] == [r.tokens for r in res.results]  # streams what it returns
    return res


def seeded(n: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(100 + i) for i in range(n)]


@pytest.mark.parametrize("modality", ["text", "image", "mesh", "mesh lossless"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "t1", "top-k-p"])
def test_ar_steps_decode_what_the_draft_verify_of_the_empty_draft_decodes(modality, params):
    """AR's policy against the generic step it replaces (a drafter per row, verdicts, a budget): the same tokens for
    every row, batched with refills, each row's own random stream; images through the CFG target, meshes under the
    rules mesh AR judged its empty drafts by (the paper's criterion by default, rejection sampling)."""
    rule, stop = judge, ()
    if modality == "text":
        target, prompts, n = ModelTarget(tiny_model(2)), ragged_prompts(5, seed=6), 19
    elif modality == "image":
        target, prompts, n = CFGTarget(tiny_image_gpt(5), 3.0), [[0], [2], [1], [1], [2]], 16
    else:
        clouds = procedural_clouds(range(11, 16))
        target, prompts, n, stop = MeshTarget(tiny_mesh_model(), clouds), [[i] for i in range(5)], 40, (5120,)
        opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1) if "lossless" in modality \
            else XSpecMeshOptions()
        rule = mesh_rule(opts, params)
    generic = DraftVerify(EachRow(lambda i: EmptyDrafter()), rule, FixedBudget(256))
    want = decode_batch(target, generic, prompts, n, params, stop, generators=seeded(len(prompts)), batch_size=3)
    got = decode_batch(target, ArSteps(), prompts, n, params, stop, generators=seeded(len(prompts)), batch_size=3)
    assert [r.tokens for r in got.results] == [r.tokens for r in want.results]
    ahead = decode_batch(target, ArSteps(4), prompts, n, params, stop, generators=seeded(len(prompts)), batch_size=3)
    assert [r.tokens for r in ahead.results] == [r.tokens for r in want.results]  # run_ahead 4: the same streams
    assert sum(len(r.tokens) for r in got.results) > 3 * len(prompts)
    if not params.greedy:  # the control: another stream draws other tokens
        other = decode_batch(target, ArSteps(), prompts, n, params, stop, generators=seeded(len(prompts))[::-1],
                             batch_size=3)
        assert [r.tokens for r in other.results] != [r.tokens for r in got.results]


def test_mesh_run_ahead_decodes_what_mesh_ar_decodes():
    """Meshes too: K greedy steps a host read, batched with refills, the end token met mid-chunk by some rows."""
    model, clouds = tiny_mesh_model(), procedural_clouds(range(11, 16))
    end = MeshDecoder(model, None).generate_batch(clouds[:1], SamplingParams(), 13)[0].tokens[-1]  # an end token met
    decoder = MeshDecoder(model, None, eos_id=end)
    ar = [r.tokens for r in decoder.generate_batch(clouds, SamplingParams(), 60, batch_size=2)]
    got = [r.tokens for r in decoder.generate_batch(clouds, SamplingParams(), 60, batch_size=2, run_ahead=8)]
    assert got == ar and any(len(t) % 8 and t[-1] == end for t in ar)  # the control: a row ends mid-chunk
    cfg = MeshGenConfig(method="ar", method_options={"run_ahead": 8}, temperature=0.0)
    assert parse_request(cfg, "mesh").options.run_ahead == 8


def test_every_modalitys_ar_runs_ar_steps():
    """One implementation of AR: the method table's drafter and the mesh decoder's AR both step with `ArSteps`."""
    assert isinstance(EmptyDrafter().step_policy(None, None, judge, FixedBudget(0)), ArSteps)
    seen = []
    with mock.patch("specgen.methods.xspecmesh.decode_batch",
                    lambda target, step, *a, **k: seen.append(step) or mock.Mock(results=[])):
        MeshDecoder(tiny_mesh_model(), None).generate_batch(procedural_clouds([11]), SamplingParams(), 8)
    assert isinstance(seen[0], ArSteps)


@pytest.mark.parametrize("k,batch_size,params", [(2, 0, SamplingParams()), (3, 2, SamplingParams()),
                                                 (8, 0, SamplingParams()), (3, 2, SamplingParams(temperature=1.0)),
                                                 (8, 0, SamplingParams(temperature=0.8, top_k=20, top_p=0.9))],
                         ids=["k2", "k3-b2", "k8", "k3-b2-t1", "k8-top-k-p"])
def test_run_ahead_decodes_what_ar_decodes_with_stops_and_budgets_mid_chunk(k, batch_size, params):
    """Ragged rows, a budget that no chunk ends on, a stop token some rows meet mid-chunk, rows refilled (batch 2 of
    5 prompts): every row's tokens are AR's, greedy or sampled (each row's own stream)."""
    model, prompts = tiny_model(1), ragged_prompts(5, seed=3)
    ar = decode(ModelTarget(model), prompts, 23, stop=(7,), params=params)
    got = decode(ModelTarget(model), prompts, 23, k, stop=(7,), batch_size=batch_size, params=params)
    assert [r.tokens for r in got.results] == [r.tokens for r in ar.results]
    assert any(len(r.tokens) < 23 for r in ar.results)  # the control: a stop token cut some row short
    for r, a in zip(got.results, ar.results):  # each step counts, none past a budget: AR's forwards unless it stopped
        assert r.stats.tau == 1.0 or r.tokens == [7]  # (a sampled first token may stop a row before any step)
        assert r.stats.target_forwards == a.stats.target_forwards or 7 in r.tokens


def test_run_ahead_at_the_context_end_feeds_no_position_past_it():
    """A prompt + budget that fill the context exactly, a budget no chunk ends on: the last steps shrink to what the
    row may still add (a position past the context has no rotary row: an IndexError, a device assert on CUDA)."""
    model = tiny_model(0, max_seq_len=64)
    prompt = ragged_prompts(1, seed=5)[0]
    n = 64 - len(prompt)
    assert n % 8 and decode(ModelTarget(model), [prompt], n, 8).results[0].tokens == \
        decode(ModelTarget(model), [prompt], n).results[0].tokens


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "top-k-p"])
@pytest.mark.parametrize("capture", [False, True], ids=["static", "traced"])
def test_run_ahead_steps_as_graph_replays_decode_what_eager_ar_decodes(capture, params, monkeypatch):
    """Every step a replay; sampled, each step's draw too (the walk captured in the target's graphs)."""
    if capture:  # the CPU replay emulation of a CUDA graph capture (tests/models/test_graphs.py)
        monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    prompts = ragged_prompts(3, seed=4)
    eager = decode(ModelTarget(tiny_model(0)), prompts, 21, params=params)
    model = tiny_model(0)
    got = decode(static_target(model, capture), prompts, 21, 4, params=params)
    assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]
    per_step = 4 if params.greedy else 8  # a forward a step, and a walk
    assert model.graphs.eager_calls == 0 and model.graphs.replays == per_step * got.stats.steps


def test_sampled_run_ahead_reads_the_host_once_a_loop_step(monkeypatch):
    """Sampled with top-k and top-p: no host read inside a loop step's steps (each draw's filter and walk on the
    device); the loop step's one read is `settle`'s."""
    params, prompts = SamplingParams(temperature=0.8, top_k=20, top_p=0.9), ragged_prompts(2, seed=8)
    ar = decode(ModelTarget(tiny_model(1)), prompts, 17, params=params)
    reads, calls = host_reads_inside(monkeypatch, ArSteps)
    got = decode(ModelTarget(tiny_model(1)), prompts, 17, 4, params=params)
    assert [r.tokens for r in got.results] == [r.tokens for r in ar.results] and len(calls) > 3 and reads == []


@pytest.mark.parametrize("options,modality,temperature,message", [
    ({"run_ahead": 0}, "text", 0.0, "run_ahead must be an integer in 1..64"),
    ({"run_ahead": 65}, "text", 0.0, "run_ahead must be an integer in 1..64"),
])
def test_run_ahead_is_refused_where_it_cannot_run(options, modality, temperature, message):
    cfg = TextGenConfig(method="ar", method_options=options, temperature=temperature)
    with pytest.raises(UsageError, match=message):
        parse_request(cfg, modality)
    ok = TextGenConfig(method="ar", method_options={"run_ahead": 4}, temperature=0.7)  # sampled too
    assert parse_request(ok, "text").options.run_ahead == 4
