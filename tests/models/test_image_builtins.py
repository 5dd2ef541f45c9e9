"""The shipped image checkpoints (VQ, c2i GPT, EAGLE drafter) materialise offline and fit together."""

from __future__ import annotations

import pytest
import torch

from specgen import registry
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def test_tiny_vq_builtin_roundtrip():
    entry = registry.find("tiny-image-vq")
    assert entry.kind == "vq" and entry.meta["modality"] == "image" and entry.meta["vocab_size"] == 512
    vq = registry.load_module(entry)
    img = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        codes = vq.encode(img)
        assert codes.shape == (1, 16, 16) or codes.numel() == 256
        assert vq.decode_indices(codes.view(1, 16, 16)).shape == (1, 3, 64, 64)


def test_tiny_gpt_and_eagle_builtins_fit():
    from specgen.models.eagle import EagleNet
    from specgen.train.image_gpt import sample_c2i

    gpt_entry, eagle_entry = registry.find("tiny-image-gpt"), registry.find("tiny-image-eagle")
    registry.check_pair(eagle_entry, gpt_entry)
    meta = gpt_entry.meta
    assert meta["modality"] == "image" and meta["vq"] == "tiny-image-vq" and meta["grid"] == 16
    assert len(meta["classes"]) == meta["kwargs"]["num_classes"] == 16
    gpt, eagle = registry.load_module(gpt_entry), registry.load_module(eagle_entry)
    assert isinstance(eagle, EagleNet)
    toks, feats = sample_c2i(gpt, torch.tensor([0]), cfg_scale=4.0, generator=torch.Generator().manual_seed(0),
                             features=True)
    assert toks.shape == (1, 256) and int(toks.max()) < 512
    with torch.no_grad():
        h = eagle(feats[0, :, :-1], toks[:, :-1], torch.arange(1, 256)[None])
        logits = EagleNet.logits(h, gpt)
    assert logits.shape == (1, 255, 512)
