"""Mesh GPTs with int8 / int4 decoder weights (self- and cross-attention, MLP, tied head; weight-only, bfloat16
activations, encoder and heads at bfloat16): lossless XSpecMesh equals AR of the same quantized backbone, greedy."""

from __future__ import annotations

import pytest
import torch

from specgen.models.quantize import QuantizedLinear, quantize_model
from tests.image_fixtures import one_thread
from tests.mesh.mesh_fixtures import tiny_heads, tiny_mesh_model
from tests.mesh.test_mesh_bf16 import LOSSLESS, LOSSLESS_MESH, clouds, decode_all  # noqa: F401 - clouds: fixture

BF16 = torch.bfloat16

_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_lossless_xspecmesh_on_a_quantized_backbone_is_its_greedy_ar(clouds, mode):  # noqa: F811
    from specgen.methods.xspecmesh import MeshDecoder

    assert "ar" in LOSSLESS_MESH
    model = quantize_model(tiny_mesh_model(), mode, 32)
    blk = model.decoder.layers[0]
    assert isinstance(blk.cross_attention.wkv, QuantizedLinear) and isinstance(model.decoder.output, QuantizedLinear)
    assert model.start.dtype == BF16 and next(model.encoder.parameters()).dtype == BF16
    ar = decode_all(MeshDecoder(model, None), clouds, None, 1)
    assert all(len(t) > 4 for t in ar)
    for batch_size in (1, 3):
        xs = decode_all(MeshDecoder(model, tiny_heads().to(BF16)), clouds, LOSSLESS, batch_size)
        assert xs == ar, (mode, batch_size)


def test_quantized_mesh_logits_are_close_to_the_float_model(clouds):  # noqa: F811
    """Control: the quantized backbone is a quantization of the float one (close, not equal, logits)."""
    from specgen.mesh.target import MeshTarget

    def first_logits(model):
        target = MeshTarget(model, clouds[:1])
        return target.prefill(torch.tensor([[0]]), target.new_cache(1, 8)).logits.float()

    model = tiny_mesh_model()
    want = first_logits(model)
    got = first_logits(quantize_model(model, "int8", 32))
    assert not torch.equal(got, want) and (got - want).abs().max() < 0.1 * want.abs().max()


@pytest.mark.slow
def test_load_mesh_model_quantized():
    """The built-in mesh backbone and its stage-1 heads: int8 at load, XSpecMesh (lossless rule) equals AR."""
    from dataclasses import replace

    from specgen.generate.mesh import MeshGenConfig, generate_meshes, load_conditions, load_mesh_model
    from specgen.request import parse_request

    loaded = load_mesh_model(None, "xspecmesh-ca-tiny-s1", "cpu", quantize="int8")
    assert isinstance(loaded.decoder.model.decoder.layers[0].attention.wqkv, QuantizedLinear)
    assert next(loaded.decoder.heads.parameters()).dtype == BF16
    cfg = MeshGenConfig(num=1, max_new_tokens=30, temperature=0.0)
    conds = load_conditions(None, 1, int(loaded.target.meta.get("num_points", 2048)), 0)
    lossless = dict(criterion="rejection", sampling="tree", top_k_tree=1)
    xs = generate_meshes(loaded, conds, parse_request(replace(cfg, method_options=lossless), "mesh"))
    ar = generate_meshes(load_mesh_model(loaded.target.ref, None, "cpu", "int8"), conds,
                         parse_request(replace(cfg, method="ar"), "mesh"))
    assert xs[0].tokens == ar[0].tokens and len(ar[0].tokens) > 0
