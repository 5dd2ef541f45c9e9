"""Deterministic class-labelled crops of the natural images bundled offline in skimage/sklearn/matplotlib."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset


def _skimage():
    import skimage.data  # deferred: start-up (only the sources a run crops are imported)

    return skimage.data


def _sklearn(name: str) -> np.ndarray:
    from sklearn.datasets import load_sample_image  # deferred: start-up, as skimage above

    return load_sample_image(name)


def _grace_hopper() -> np.ndarray:
    from matplotlib import cbook  # deferred: start-up, as skimage above

    path = cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


# Only loaders that read files shipped inside the installed wheels (research/offline_assets.md).
# Never add skimage loaders that go through pooch (eagle, lily, cells3d, ...) or sklearn fetch_*.
_SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "astronaut": lambda: _skimage().astronaut(),
    "chelsea": lambda: _skimage().chelsea(),
    "coffee": lambda: _skimage().coffee(),
    "rocket": lambda: _skimage().rocket(),
    "hubble": lambda: _skimage().hubble_deep_field(),
    "retina": lambda: _skimage().retina(),
    "immunohistochemistry": lambda: _skimage().immunohistochemistry(),
    "motorcycle": lambda: _skimage().stereo_motorcycle()[0],  # left view only; the right is nearly identical
    "china": lambda: _sklearn("china.jpg"),  # CC BY 2.0 (Flickr: danielbuechele)
    "flower": lambda: _sklearn("flower.jpg"),  # CC BY 2.0 (Flickr: vultilion)
    "grace_hopper": _grace_hopper,
    "camera": lambda: _skimage().camera(),  # greyscale sources are replicated to 3 channels
    "coins": lambda: _skimage().coins(),
    "moon": lambda: _skimage().moon(),
    "clock": lambda: _skimage().clock(),
    "brick": lambda: _skimage().brick(),
}

IMAGE_CLASSES: tuple[str, ...] = tuple(_SOURCES)  # fixed order: class id = position in this tuple
SPLITS: tuple[str, ...] = ("train", "eval")
MAX_SHORT_SIDE = 256  # sources are first downscaled so that min(H, W) <= this
MAX_SCALE = 2.5  # crop side in source pixels is uniform in [crop_size, crop_size * MAX_SCALE]
EVAL_FRACTION = 0.25  # last fraction of each image's longer axis is reserved for eval
MIN_STD = 0.03  # crops whose pixel std (in [0, 1] units) is below this are redrawn
MAX_TRIES = 32  # redraws before a low-variance crop is kept anyway (a crop is flipped with probability 1/2)


@dataclass(frozen=True)
class ImageCropsConfig:
    """How crops are drawn. Eval crops come from a strip of each image that train crops never touch."""

    split: str = "train"  # "train" | "eval"
    num_samples: int = 100_000  # dataset length; sample i has class i % num_classes
    crop_size: int = 64  # output side in pixels
    seed: int = 0


def _to_rgb_float(img: np.ndarray) -> torch.Tensor:
    """uint8 [H,W] or [H,W,C] -> float [3,H,W] in [0, 1]."""
    t = torch.from_numpy(np.array(img, dtype=np.float32)) / 255.0
    return (t[None].expand(3, -1, -1) if t.ndim == 2 else t[..., :3].permute(2, 0, 1)).contiguous()  # [3,H,W]


@functools.lru_cache(maxsize=None)
def load_source(name: str) -> torch.Tensor:
    """One bundled image as float [3,H,W] in [0,1], area-downscaled so that min(H,W) <= MAX_SHORT_SIDE."""
    img = _to_rgb_float(_SOURCES[name]())  # [3,H,W]
    h, w = img.shape[-2:]
    scale = MAX_SHORT_SIDE / min(h, w)
    if scale < 1.0:
        size = (max(1, round(h * scale)), max(1, round(w * scale)))
        img = F.interpolate(img[None], size=size, mode="area")[0]  # [3,h',w']
    return img.clamp(0.0, 1.0)


def _split_region(h: int, w: int, split: str) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the region a split draws from: eval = tail strip of the longer axis."""
    if h >= w:
        cut = h - max(1, round(h * EVAL_FRACTION))
        return (0, 0, cut, w) if split == "train" else (cut, 0, h - cut, w)
    cut = w - max(1, round(w * EVAL_FRACTION))
    return (0, 0, h, cut) if split == "train" else (0, cut, h, w - cut)


class ImageCrops(Dataset):
    """Map-style dataset: item i -> (image [3,S,S] float in [-1,1], class id). Same config, same items."""

    def __init__(self, config: ImageCropsConfig = ImageCropsConfig()) -> None:
        self.config = config
        self.classes = IMAGE_CLASSES
        self.sources = [load_source(c) for c in IMAGE_CLASSES]  # each [3,H,W]
        self.regions = [_split_region(s.shape[1], s.shape[2], config.split) for s in self.sources]
        for name, (_, _, rh, rw) in zip(IMAGE_CLASSES, self.regions):
            if min(rh, rw) < config.crop_size:
                raise ValueError(f"{config.split} region of {name!r} is smaller than crop_size {config.crop_size}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return self.config.num_samples

    def _draw(self, rng: np.random.Generator, label: int) -> torch.Tensor:
        cfg = self.config
        src = self.sources[label]  # [3,H,W]
        top, left, rh, rw = self.regions[label]
        max_side = min(rh, rw, int(cfg.crop_size * MAX_SCALE))
        side = int(rng.integers(cfg.crop_size, max_side + 1))
        y = top + int(rng.integers(0, rh - side + 1))
        x = left + int(rng.integers(0, rw - side + 1))
        crop = src[:, y : y + side, x : x + side]  # [3,side,side]
        if side != cfg.crop_size:
            crop = F.interpolate(
                crop[None], size=(cfg.crop_size, cfg.crop_size), mode="bilinear", antialias=True, align_corners=False
            )[0]  # [3,S,S]
        if rng.random() < 0.5:
            crop = crop.flip(-1)
        return crop

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        cfg = self.config
        label = index % self.num_classes
        rng = np.random.default_rng([cfg.seed, SPLITS.index(cfg.split), index])
        crop = self._draw(rng, label)
        for _ in range(MAX_TRIES - 1):
            if float(crop.std()) >= MIN_STD:
                break
            crop = self._draw(rng, label)
        return (crop.clamp(0.0, 1.0) * 2.0 - 1.0).contiguous(), label  # [3,S,S] in [-1,1]

    def batch(self, indices: list[int] | range) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack items: images [B,3,S,S], labels [B] (int64)."""
        items = [self[i] for i in indices]
        return torch.stack([im for im, _ in items]), torch.tensor([lb for _, lb in items], dtype=torch.long)


def crops(split: str, n: int, crop_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `n` crops of a split: images [n,3,S,S] in [-1,1], labels [n]."""
    return ImageCrops(ImageCropsConfig(split=split, num_samples=n, crop_size=crop_size, seed=seed)).batch(range(n))
