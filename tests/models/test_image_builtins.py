"""The shipped image checkpoints (VQ, c2i GPT, EAGLE drafter) materialise offline and fit together."""

from __future__ import annotations

import pytest
import torch

from specgen import checkpoints, registry
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def test_tiny_vq_builtin_roundtrip():
    entry = checkpoints.find("tiny-image-vq")
    assert entry.kind == "vq" and entry.meta["modality"] == "image" and entry.meta["vocab_size"] == 512
    vq = checkpoints.load_module(entry)
    img = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        codes = vq.encode(img)
        assert codes.shape == (1, 16, 16) or codes.numel() == 256
        assert vq.decode_indices(codes.view(1, 16, 16)).shape == (1, 3, 64, 64)


def test_tiny_gpt_and_eagle_builtins_fit():
    from specgen.models.eagle import EagleNet
    from specgen.train.image_gpt import sample_images

    gpt_entry, eagle_entry = checkpoints.find("tiny-image-gpt"), checkpoints.find("tiny-image-eagle")
    registry.check_pair(eagle_entry, gpt_entry)
    meta = gpt_entry.meta
    assert meta["modality"] == "image" and meta["vq"] == "tiny-image-vq" and meta["grid"] == 16
    assert len(meta["classes"]) == meta["kwargs"]["num_classes"] == 16
    gpt, eagle = checkpoints.load_module(gpt_entry), checkpoints.load_module(eagle_entry)
    assert isinstance(eagle, EagleNet)
    toks, feats = sample_images(gpt, torch.tensor([0]), cfg_scale=4.0, generator=torch.Generator().manual_seed(0),
                                features=True)
    assert toks.shape == (1, 256) and int(toks.max()) < 512
    with torch.no_grad():
        h = eagle(feats[0, :, :-1], toks[:, :-1], torch.arange(1, 256)[None])
        logits = EagleNet.logits(h, gpt)
    assert logits.shape == (1, 255, 512)


def test_a_builtin_is_reinstalled_when_the_shipped_weights_change(tmp_path, monkeypatch):
    """A package upgrade (or a recipe rerun) that ships new weights must not leave the old registry copy in use."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specgen import builtins, checkpoints

    assets = tmp_path / "assets"
    shutil.copytree(builtins.ASSETS / "image" / "classifier", assets / "image" / "classifier")
    monkeypatch.setattr(builtins, "ASSETS", assets)
    first = checkpoints.find("tiny-image-classifier")
    assert first.meta["asset_sha"] == builtins.asset_fingerprint(builtins.BUILTINS["tiny-image-classifier"].asset)
    assert checkpoints.find("tiny-image-classifier").meta["asset_sha"] == first.meta["asset_sha"]  # unchanged: kept

    weights = assets / "image" / "classifier" / "model.safetensors"
    state = load_file(str(weights))
    key = sorted(state)[0]
    state[key] = state[key] + 1
    save_file(state, str(weights))
    again = checkpoints.find("tiny-image-classifier")
    assert again.meta["asset_sha"] != first.meta["asset_sha"]
    assert torch.equal(load_file(str(again.path / "model.safetensors"))[key], state[key])
