"""Image metrics: Fréchet distance closed forms, classifier shapes/training, reference cache, plots, built-in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from specgen.eval.plots import speed_quality_plot
from specgen.image.grid import image_grid
from specgen.image.metrics import (
    ImageClassifier,
    class_accuracy,
    fid_from_features,
    image_features,
    reference_features,
)


def gaussian(n: int, d: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)) * scale


def test_fid_identical_sets_is_zero():
    a = gaussian(500, 16, 0)
    assert fid_from_features(a, a.copy()) == pytest.approx(0.0, abs=1e-6)
    assert fid_from_features(torch.from_numpy(a).float(), torch.from_numpy(a).float()) == pytest.approx(0.0, abs=1e-4)


def test_fid_mean_shift_closed_form():
    a = gaussian(400, 8, 1)
    shift = np.linspace(-1.0, 2.0, 8)
    assert fid_from_features(a, a + shift) == pytest.approx(float(shift @ shift), rel=1e-6)  # same covariance
    b = gaussian(20000, 4, 2) + 1.5  # independent samples: |mu|^2 = 4 * 2.25 = 9
    assert fid_from_features(gaussian(20000, 4, 3), b) == pytest.approx(9.0, abs=0.15)


def test_fid_scale_closed_form():
    d, s = 4, 2.0  # N(0, I) vs N(0, s^2 I): tr(I + s^2 I - 2 s I) = d (1 - s)^2
    fid = fid_from_features(gaussian(20000, d, 4), gaussian(20000, d, 5, s))
    assert fid == pytest.approx(d * (1 - s) ** 2, abs=0.15)


def test_fid_singular_covariance_is_finite():
    a, b = gaussian(5, 32, 6), gaussian(7, 32, 7)  # N < F: rank-deficient covariances
    fid = fid_from_features(a, b)
    assert math.isfinite(fid) and fid > 0
    with pytest.raises(ValueError):
        fid_from_features(a[:1], b)


def test_classifier_shapes():
    clf = ImageClassifier(num_classes=16, widths=(8, 16, 24)).eval()
    x = torch.rand(3, 3, 64, 64) * 2 - 1
    assert clf.features(x).shape == (3, 24) and clf(x).shape == (3, 16)
    assert image_features(clf, x, batch_size=2).shape == (3, 24)


def test_accuracy_on_separable_batch_after_a_few_steps():
    torch.manual_seed(0)
    labels = torch.arange(32) % 2
    images = (labels.float() * 1.2 - 0.6).view(-1, 1, 1, 1) + 0.1 * torch.randn(32, 3, 32, 32)  # dark vs bright
    clf = ImageClassifier(num_classes=2, widths=(8, 16), image_size=32)
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-2)
    for _ in range(15):
        loss = F.cross_entropy(clf(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    clf.eval()
    assert class_accuracy(clf, images, labels, batch_size=10) == 1.0
    assert fid_from_features(image_features(clf, images), image_features(clf, images)) == pytest.approx(0.0, abs=1e-3)


def test_reference_features_are_cached(specgen_home):
    clf = ImageClassifier(widths=(8, 16)).eval()
    first = reference_features(clf, n=32, seed=0)
    files = list((specgen_home / "artefacts").rglob("*.safetensors"))
    assert first.shape == (32, 16) and len(files) == 1
    assert torch.equal(reference_features(clf, n=32, seed=0), first)  # served from the cache
    assert not torch.equal(reference_features(clf, n=32, seed=0, split="eval"), first)  # another split, another entry
    torch.nn.init.zeros_(clf.head.weight)  # another classifier -> another cache entry
    reference_features(clf, n=32, seed=0)
    assert len(list((specgen_home / "artefacts").rglob("*.safetensors"))) == 3


def test_speed_quality_plot_and_grid(tmp_path):
    rows = [{"method": "ar", "speedup_vs_ar": 1.0, "fid": 12.0}, {"method": "eagle", "speedup_vs_ar": 1.8, "fid": 12.5},
            {"method": "lantern", "speedup_vs_ar": 2.4, "fid": None}]
    path = speed_quality_plot(rows, path=tmp_path / "sub" / "plot.png")
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["plot.png"]  # no temp file left behind
    grid = image_grid(torch.rand(10, 3, 16, 16) * 2 - 1, nrow=4, pad=2)
    assert isinstance(grid, Image.Image) and grid.mode == "RGB"
    assert grid.size == (4 * 18 + 2, 3 * 18 + 2)  # (width, height): 4 columns, 3 rows
    assert np.asarray(image_grid(-torch.ones(1, 3, 4, 4), pad=0)).max() == 0


def test_shipped_classifier_builtin():
    from specgen import checkpoints
    from specgen.data.images import ImageCrops, ImageCropsConfig

    entry = checkpoints.find("tiny-image-classifier")
    assert entry.kind == "classifier" and entry.meta["builder"] == "image-classifier"
    assert entry.meta["metrics"]["unseen_train_crops_vq_recon_accuracy"] >= 0.95
    clf = checkpoints.load_module(entry)
    assert isinstance(clf, ImageClassifier) and clf.num_classes == 16
    images, labels = ImageCrops(ImageCropsConfig(split="train", num_samples=64, seed=11)).batch(range(64))
    assert class_accuracy(clf, images, labels) >= 0.95  # unseen crops of the region the generators learn


def test_training_writes_a_loadable_checkpoint(tmp_path):
    from specgen import checkpoints, registry
    from specgen.train.classifier import ClassifierTrainConfig, train

    cfg = ClassifierTrainConfig(widths=[8, 16], steps=3, batch_size=16, eval_samples=16, eval_every=3, vq="")
    metrics = train(cfg, tmp_path)
    assert 0.0 <= metrics["heldout_accuracy"] <= 1.0 and len(metrics["heldout_per_class"]) == 16
    clf = checkpoints.load_module(registry.entry_at(tmp_path))  # builder "image-classifier" + fp16 weights
    assert isinstance(clf, ImageClassifier) and clf.features(torch.zeros(1, 3, 64, 64)).shape == (1, 16)
