"""Offline image-crop dataset: determinism, classes, value range, held-out split, no network."""

from __future__ import annotations

import socket

import torch

from specgen.data import images as im
from specgen.data.images import IMAGE_CLASSES, ImageCrops, ImageCropsConfig


def test_classes_fixed_and_labels_balanced() -> None:
    assert len(IMAGE_CLASSES) == 16 and len(set(IMAGE_CLASSES)) == 16
    assert IMAGE_CLASSES[:3] == ("astronaut", "chelsea", "coffee")
    ds = ImageCrops(ImageCropsConfig(num_samples=40))
    assert ds.num_classes == 16 and len(ds) == 40
    _, labels = ds.batch(range(32))
    assert labels.tolist() == [i % 16 for i in range(32)]


def test_deterministic_for_a_seed() -> None:
    a = ImageCrops(ImageCropsConfig(num_samples=20, seed=3))
    b = ImageCrops(ImageCropsConfig(num_samples=20, seed=3))
    c = ImageCrops(ImageCropsConfig(num_samples=20, seed=4))
    xa, ya = a.batch(range(20))
    xb, yb = b.batch(range(20))
    xc, _ = c.batch(range(20))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, xc)
    assert torch.equal(a[7][0], xa[7])  # random access gives the same item


def test_shape_range_and_variance() -> None:
    ds = ImageCrops(ImageCropsConfig(num_samples=64))
    x, _ = ds.batch(range(64))
    assert x.shape == (64, 3, 64, 64) and x.dtype == torch.float32
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    assert float(x.max()) > 0.5 and float(x.min()) < -0.5
    stds = ((x + 1) / 2).flatten(1).std(1)
    assert float((stds >= im.MIN_STD).float().mean()) >= 0.95  # near-constant crops are redrawn
    small = ImageCrops(ImageCropsConfig(num_samples=4, crop_size=32))
    assert small[0][0].shape == (3, 32, 32)


def test_eval_split_is_held_out() -> None:
    train = ImageCrops(ImageCropsConfig(split="train", num_samples=16))
    evals = ImageCrops(ImageCropsConfig(split="eval", num_samples=16))
    for src, (t0, l0, th, tw), (e0, el, eh, ew) in zip(train.sources, train.regions, evals.regions):
        h, w = src.shape[1:]
        assert eh >= 64 and ew >= 64
        rows_overlap = max(t0, e0) < min(t0 + th, e0 + eh)
        cols_overlap = max(l0, el) < min(l0 + tw, el + ew)
        assert not (rows_overlap and cols_overlap)  # disjoint regions of every source image
        assert (th * tw + eh * ew) == h * w
    assert not torch.equal(train.batch(range(16))[0], evals.batch(range(16))[0])


def test_no_network_needed(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("image dataset tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    im.load_source.cache_clear()
    ds = ImageCrops(ImageCropsConfig(num_samples=16))
    x, _ = ds.batch(range(16))
    assert x.shape == (16, 3, 64, 64)
    assert all(min(s.shape[1:]) == 256 for s in ds.sources)
