"""Image GPTs with int8 / int4 weights (weight-only, bfloat16 activations): every lossless image method in the method
table equals AR of the same quantized model (greedy, CFG, batch 1 and 3), and the built-in model loads quantized."""

from __future__ import annotations

import pytest
import torch

from specgen.errors import UsageError
from specgen.models.quantize import QuantizedLinear, quantize_model
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image.test_image_batched import LOSSLESS_IMAGE
from tests.image.test_image_bf16 import check_lossless
from tests.image_fixtures import one_thread

BF16 = torch.bfloat16

_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
def test_lossless_image_methods_on_a_quantized_gpt_equal_its_ar(method, mode):
    model = tiny_image_gpt(5)
    drafter = TinyEagle(model).eval().to(BF16)  # made from the float model: its own bf16 embedding copy
    check_lossless(quantize_model(model, mode, 32), drafter, method, 3.0)


def test_quantized_image_gpt_is_close_to_its_float_model():
    """Control for the test above: the quantized GPT is a real quantization of the float one (close logits, its
    blocks' linears replaced), not the float model under another name."""
    model = tiny_image_gpt(5)
    ids, pos = torch.randint(0, 32, (1, 6)), torch.arange(1, 7)[None]
    want = model(ids, pos)[0]
    quantize_model(model, "int8", 32)
    assert all(isinstance(m, QuantizedLinear) for m in (model.layers[0].attention.wqkv, model.output))
    assert model.cls_embedding.embedding_table.weight.dtype == BF16
    got = model(ids, pos)[0].float()
    assert not torch.equal(got, want)
    assert (got - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.slow
def test_load_image_model_quantized_and_greedy_adt_tree_equals_ar():
    """The built-in tiny image GPT quantized at load (`dtype` may name the quantization, as benchmark rows do); its
    shipped EAGLE drafter runs at bfloat16 and the VQ at float32."""
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.request import parse_request

    im = load_image_model("tiny-image-gpt", dtype="int8")
    assert isinstance(im.model.layers[0].feed_forward.w13, QuantizedLinear)
    assert next(im.drafter_net.parameters()).dtype == BF16 and next(im.vq.parameters()).dtype == torch.float32
    base = dict(num=2, temperature=0.0, seed=0)
    ar, px = generate_images(im, parse_request(ImageGenConfig(method="ar", **base), "image"))
    adt, _ = generate_images(im, parse_request(ImageGenConfig(method="adt-tree", **base), "image"))
    assert [s.tokens for s in adt] == [s.tokens for s in ar]
    assert px.dtype == torch.float32 and px.shape[0] == 2


def test_quantize_with_float32_activations_is_refused():
    from specgen.generate.image import load_image_model

    with pytest.raises(UsageError, match="bfloat16 activations"):
        load_image_model("tiny-image-gpt", dtype="float32", quantize="int8")
