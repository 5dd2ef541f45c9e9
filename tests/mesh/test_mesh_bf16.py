"""Mesh targets in bfloat16: backbone and heads in bfloat16 (point clouds cast on entry), logits read in float32 by
the accept rules; lossless XSpecMesh (criterion rejection) equals AR of the same bfloat16 backbone, greedy."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.methods import METHODS
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from tests.image_fixtures import one_thread
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

BF16 = torch.bfloat16
LOSSLESS = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)
LOSSLESS_MESH = sorted(name for name, spec in METHODS.items() if spec.runs_on("mesh") and spec.lossless)

_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


@pytest.fixture(scope="module")
def clouds():
    return procedural_clouds(range(11, 14))


def decode_all(decoder, clouds, opts, batch_size):
    gens = [torch.Generator().manual_seed(3 + i) for i in range(len(clouds))]
    dgens = [torch.Generator().manual_seed(100 + i) for i in range(len(clouds))]
    return [r.tokens for r in decoder.generate_batch(clouds, SamplingParams(), 60, opts, gens, dgens, batch_size)]


def test_lossless_xspecmesh_in_bf16_is_bf16_greedy_ar(clouds):
    assert "ar" in LOSSLESS_MESH  # xspecmesh is lossless under criterion=rejection (its spec: lossy by default)
    model = tiny_mesh_model().to(BF16)
    ar = decode_all(MeshDecoder(model, None), clouds, None, 1)
    assert all(len(t) > 4 for t in ar)
    for batch_size in (1, 3):
        xs = decode_all(MeshDecoder(model, tiny_heads().to(BF16)), clouds, LOSSLESS, batch_size)
        assert xs == ar, batch_size


def test_sampled_bf16_ar_meshes_do_not_depend_on_their_batch():
    """bfloat16 logits tie often at the top-k cut: a neighbour's ties must not change a mesh's filtered distribution
    (BPT's sampling, T 1 here); mesh 3 drew another token at step 11 beside a tied row before per-row top-k."""
    model, clouds = tiny_mesh_model().to(BF16), procedural_clouds(range(11, 16))
    params = SamplingParams(1.0, 50, 0.95)

    def decode(indices, batch_size):
        gens = [torch.Generator().manual_seed(3 + i) for i in indices]
        return [r.tokens for r in MeshDecoder(model, None).generate_batch([clouds[i] for i in indices], params, 50,
                                                                          None, gens, None, batch_size)]

    assert decode(range(5), 3) == [decode([i], 1)[0] for i in range(5)]


def test_bf16_mesh_target_runs_in_bf16(clouds):
    from specgen.mesh.target import MeshTarget

    model = tiny_mesh_model().to(BF16)
    target = MeshTarget(model, clouds[:1])
    cache = target.new_cache(1, 16)
    out = target.prefill(torch.tensor([[0]]), cache)
    assert cache.k.dtype == BF16 and out.logits.dtype == BF16


@pytest.mark.slow
def test_load_mesh_model_in_bf16():
    """The built-in mesh backbone and its heads (stage 1: no adapter, so AR of the backbone is the reference) load in bfloat16 and decode."""
    from dataclasses import replace

    from specgen.generate.mesh import MeshGenConfig, generate_meshes, load_conditions, load_mesh_model
    from specgen.request import parse_request

    loaded = load_mesh_model(None, "xspecmesh-ca-tiny-s1", "cpu", "bfloat16")
    assert next(loaded.decoder.model.parameters()).dtype == BF16
    assert next(loaded.decoder.heads.parameters()).dtype == BF16
    cfg = MeshGenConfig(num=1, max_new_tokens=30, temperature=0.0, dtype="bfloat16")
    conds = load_conditions(None, 1, int(loaded.target.meta.get("num_points", 2048)), 0)
    lossless = dict(criterion="rejection", sampling="tree", top_k_tree=1)
    xs = generate_meshes(loaded, conds, parse_request(replace(cfg, method_options=lossless), "mesh"))
    ar = generate_meshes(load_mesh_model(loaded.target.ref, None, "auto", "bfloat16"), conds,
                         parse_request(replace(cfg, method="ar"), "mesh"))
    assert xs[0].tokens == ar[0].tokens and len(ar[0].tokens) > 0
