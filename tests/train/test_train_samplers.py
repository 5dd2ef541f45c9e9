"""The training-time samplers: image_gpt's class-conditional sampling without features runs on the shared
decoding loop (`decode_c2i`) and draws the same tokens as the chain that also returns features (EAGLE's data)."""

from __future__ import annotations

import pytest
import torch

from specgen.train.image_gpt import decode_c2i, sample_c2i
from tests.image_fixtures import one_thread, tiny_image_target

_threads = pytest.fixture(autouse=True)(one_thread)


@pytest.mark.parametrize("cfg_scale,temperature,top_k", [(4.0, 1.0, 0), (1.0, 0.7, 20), (2.0, 0.0, 0)])
def test_shared_loop_draws_the_chain_samplers_tokens(cfg_scale, temperature, top_k):
    model = tiny_image_target(seed=3).eval()
    labels = torch.tensor([0, 2, 1, 2, 0])
    chain, _ = sample_c2i(model, labels, cfg_scale, temperature, top_k, generator=torch.Generator().manual_seed(11),
                          features=True)
    loop = decode_c2i(model, labels, cfg_scale, temperature, top_k, generator=torch.Generator().manual_seed(11))
    assert torch.equal(chain, loop)
    assert torch.equal(sample_c2i(model, labels, cfg_scale, temperature, top_k,
                                  generator=torch.Generator().manual_seed(11)), loop)
