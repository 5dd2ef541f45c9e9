"""Image quality: FID and class accuracy in the feature space of a recipe-trained classifier."""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import numpy as np
import torch

from specgen.data.images import ImageCrops, ImageCropsConfig
from specgen.models.classifier import ImageClassifier
from specgen.registry import home
from specgen.tensor_files import cached_tensors


def fid_from_features(a: np.ndarray, b: np.ndarray, eps: float = 1e-6) -> float:
    """Fréchet distance between Gaussians fitted to feature sets a [N,F] and b [M,F] (N, M >= 2; CPU tensors too)."""
    from scipy import linalg  # optional dependency

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(f"need two [N,F] feature sets with N >= 2 and equal F, got {a.shape} and {b.shape}")
    mu1, mu2 = a.mean(0), b.mean(0)  # [F]
    s1, s2 = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))  # [F,F]
    covmean = linalg.sqrtm(s1 @ s2)
    if not np.isfinite(covmean).all():  # singular product (N <= F, duplicated rows): regularise as pytorch-fid
        offset = np.eye(s1.shape[0]) * eps
        covmean = linalg.sqrtm((s1 + offset) @ (s2 + offset))
    covmean = np.real(covmean)  # tiny imaginary parts are numerical noise
    diff = mu1 - mu2
    fid = float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * np.trace(covmean))
    return max(fid, 0.0)  # rounding can give -1e-12 for identical sets


@torch.no_grad()
def image_features(classifier: ImageClassifier, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Features of images [N,3,S,S] in [-1,1] -> [N,F] float32 (classifier in eval mode, its device)."""
    p = next(classifier.parameters())
    out = [classifier.features(c.to(p.device, p.dtype)).float().cpu() for c in images.split(batch_size)]
    return torch.cat(out) if out else torch.zeros(0, classifier.feature_dim)


@torch.no_grad()
def class_accuracy(classifier: ImageClassifier, images: torch.Tensor, labels: torch.Tensor,
                   batch_size: int = 256) -> float:
    """Fraction of images [N,3,S,S] whose argmax class equals labels [N]."""
    p = next(classifier.parameters())
    preds = torch.cat([classifier(c.to(p.device, p.dtype)).argmax(-1).cpu() for c in images.split(batch_size)])
    return float((preds == labels.cpu()).float().mean())


def reference_features(classifier: ImageClassifier, n: int = 1024, seed: int = 0, split: str = "train") -> torch.Tensor:
    """Features [n,F] of real crops (class i % 16, crop seed `seed`), cached in $SPECGEN_HOME/artefacts/. Default
    split "train": the distribution the tiny generators learn (FID references on ImageNet use train statistics)."""
    data_cfg = ImageCropsConfig(split=split, num_samples=n, crop_size=classifier.image_size, seed=seed)
    data_key = hashlib.sha256(repr(sorted(asdict(data_cfg).items())).encode()).hexdigest()[:8]
    h = hashlib.sha256()  # of the classifier's state dict: keys, shapes and fp32 values
    for k, v in sorted(classifier.state_dict().items()):
        h.update(f"{k}:{v.shape}".encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    name = f"{h.hexdigest()[:16]}-{data_key}-n{n}.safetensors"

    def build() -> dict[str, torch.Tensor]:  # features [n,F] of the crops [n,3,S,S]
        return {"features": image_features(classifier, ImageCrops(data_cfg).batch(range(n))[0])}

    return cached_tensors(home() / "artefacts" / "image-reference-features" / name, build)["features"]
