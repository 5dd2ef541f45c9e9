"""Image targets in bfloat16: weights, activations and KV cache in bfloat16, logits read in float32 by the accept
rules; every lossless image method in the method table equals AR of the same bfloat16 model (greedy, CFG)."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.target import CFGTarget
from specgen.methods import METHODS, run_batch
from specgen.methods.text import EmptyDrafter
from tests.conftest import decode
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image.test_image_batched import LOSSLESS_IMAGE, OPTIONS
from tests.image_fixtures import one_thread

GRID = 4
BF16 = torch.bfloat16

_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread


def check_lossless(model, drafter, method: str, cfg_scale: float) -> None:
    """Greedy `method` on `model` (any precision) equals AR of the same model, at batch 1 and 3 (CFG when > 1)."""
    target = CFGTarget(model, cfg_scale)
    parts = ImageParts(model, target, drafter, None, GRID)
    labels = [0, 2, 1]
    n = GRID * GRID
    ar = [decode(target, EmptyDrafter(), [c], n, SamplingParams()).tokens for c in labels]

    def make(i):
        return build_image_method(method, parts, dict(OPTIONS.get(method, {})))[0]

    for batch_size in (1, 3):
        res = run_batch(target, make, [[c] for c in labels], n, SamplingParams(), batch_size=batch_size, max_draft=32)
        assert [r.tokens for r in res.results] == ar, (method, batch_size)


@pytest.mark.parametrize("method", LOSSLESS_IMAGE)
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_lossless_image_methods_in_bf16_equal_bf16_ar(method, cfg_scale):
    model = tiny_image_gpt(5).to(BF16)
    check_lossless(model, TinyEagle(model).eval().to(BF16), method, cfg_scale)


def test_sampled_bf16_adt_tree_images_do_not_depend_on_their_batch():
    """A row's tree in a batch is the one it grows alone (docs/batching.md), also where bfloat16 path scores tie: an
    image's tried siblings, so its sampled tokens, once followed its neighbours' frontier widths (image 3 here)."""
    model = tiny_image_gpt(5).to(BF16)
    target = CFGTarget(model, 1.0)
    parts = ImageParts(model, target, TinyEagle(model).eval().to(BF16), None, GRID)
    labels = [0, 2, 1, 1, 2]

    def decode(indices, batch_size):
        gens = [torch.Generator().manual_seed(i) for i in indices]
        return [r.tokens for r in run_batch(target, lambda i: build_image_method("adt-tree", parts, {})[0],
                                            [[labels[i]] for i in indices], GRID * GRID, SamplingParams(1.0),
                                            generators=gens, batch_size=batch_size, max_draft=32).results]

    assert decode(range(5), 3) == [decode([i], 1)[0] for i in range(5)]


def test_bf16_target_runs_in_bf16():
    model = tiny_image_gpt(5).to(BF16)
    target = CFGTarget(model, 3.0)
    cache = target.new_cache(1, 2 + GRID * GRID)
    out = target.prefill(torch.tensor([[1]]), cache)
    assert cache.k.dtype == BF16 and out.logits.dtype == BF16  # KV cache and activations follow the weights


@pytest.mark.slow
def test_load_image_model_in_bf16_and_greedy_adt_tree_equals_ar():
    """The built-in tiny image GPT and its shipped EAGLE drafter (EagleNet) load in bfloat16; the VQ stays float32."""
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.request import parse_request

    im = load_image_model("tiny-image-gpt", dtype="bfloat16")
    assert next(im.model.parameters()).dtype == BF16 and next(im.drafter_net.parameters()).dtype == BF16
    assert next(im.vq.parameters()).dtype == torch.float32
    base = dict(num=2, temperature=0.0, seed=0)
    ar, px = generate_images(im, parse_request(ImageGenConfig(method="ar", **base), "image"))
    adt, _ = generate_images(im, parse_request(ImageGenConfig(method="adt-tree", **base), "image"))
    assert [s.tokens for s in adt] == [s.tokens for s in ar]
    assert px.dtype == torch.float32 and px.shape[0] == 2
    assert METHODS["adt-tree"].lossless
