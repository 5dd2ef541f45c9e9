"""Image quality: FID and class accuracy in a recipe-trained classifier's feature space, plus optional standard nets."""

# The classifier (`ImageClassifier`, built-in `tiny-image-classifier`) is trained by
# `recipes/tiny/image-classifier.yaml` on the same bundled-photo crops as the tiny image models, so its
# FID is NOT comparable with Inception FID: tables must say "clf-FID (tiny-image-classifier features)".
# Standard networks (Inception for FID, CLIP) are used only when their weights are already on disk.

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specgen.data.images import ImageCrops, ImageCropsConfig
from specgen.models.classifier import ImageClassifier
from specgen.paths import atomic_write
from specgen.registry import home

FEATURE_SPACE = "tiny-image-classifier"  # label for tables: "FID (tiny-image-classifier features)"
Array = torch.Tensor | np.ndarray


def _as_f64(x: Array) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def fid_from_features(a: Array, b: Array, eps: float = 1e-6) -> float:
    """Fréchet distance between Gaussians fitted to feature sets a [N,F] and b [M,F] (N, M >= 2)."""
    from scipy import linalg

    a, b = _as_f64(a), _as_f64(b)
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


def classifier_hash(classifier: nn.Module) -> str:
    """sha256 (first 16 hex) of the classifier's state dict: keys, dtypes, shapes and fp32 values."""
    h = hashlib.sha256()
    for k, v in sorted(classifier.state_dict().items()):
        h.update(f"{k}:{v.shape}".encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def reference_features(classifier: ImageClassifier, n: int = 1024, seed: int = 0, split: str = "train",
                       batch_size: int = 256) -> torch.Tensor:
    """Features [n,F] of real crops (class i % 16, crop seed `seed`), cached in $SPECGEN_HOME/artefacts/.

    Default split "train": the distribution the tiny generators learn, as FID references on ImageNet use
    train-set statistics. The eval split's strips show partly different content (table, wall, uniform):
    real train-region crops score clf-FID ~4.0 against them, against other train-region crops ~0.04.
    """
    data_cfg = ImageCropsConfig(split=split, num_samples=n, crop_size=classifier.image_size, seed=seed)
    data_key = hashlib.sha256(repr(sorted(asdict(data_cfg).items())).encode()).hexdigest()[:8]
    name = f"{classifier_hash(classifier)}-{data_key}-n{n}.safetensors"
    path = home() / "artefacts" / "image-reference-features" / name
    if path.is_file():
        try:
            return load_file(str(path))["features"]
        except Exception:  # a corrupt cache file is recomputed, never trusted
            pass
    images, _ = ImageCrops(data_cfg).batch(range(n))  # [n,3,S,S]
    feats = image_features(classifier, images, batch_size)  # [n,F]
    atomic_write(path, lambda tmp: save_file({"features": feats.contiguous()}, str(tmp),
                                             metadata={"n": str(n), "seed": str(seed), "split": split}))
    return feats


def classifier_metrics(classifier: ImageClassifier, images: torch.Tensor, labels: torch.Tensor,
                       reference: torch.Tensor) -> dict[str, float | str | int]:
    """FID vs reference features [M,F] and class accuracy of images [N,3,S,S] with labels [N]."""
    feats = image_features(classifier, images)  # [N,F]
    with torch.no_grad():
        p = next(classifier.parameters())
        preds = classifier.head(feats.to(p.device, p.dtype)).argmax(-1).cpu()  # [N] (eval mode: dropout is a no-op)
    acc = float((preds == labels.cpu()).float().mean())
    return {"fid": fid_from_features(feats, reference), "class_acc": acc,
            "n": len(images), "n_ref": len(reference), "feature_space": FEATURE_SPACE}


# --- standard networks: only when their weights are already on this machine -----------------------------

FID_INCEPTION = "pt_inception-2015-12-05-6726825d.pth"  # pytorch-fid's port of TF's FID Inception (torch hub cache)
CLIP_REPOS = ("openai/clip-vit-base-patch32", "openai/clip-vit-base-patch16", "openai/clip-vit-large-patch14")


@dataclass(frozen=True)
class StandardNet:
    """Can a standard metric network run offline? `detail`: its weights (path or repo id), else why not (one line)."""

    name: str
    available: bool
    detail: str


def _inception() -> StandardNet:
    weights = Path(torch.hub.get_dir()) / "checkpoints" / FID_INCEPTION
    if not importlib.util.find_spec("pytorch_fid"):
        why = "pytorch-fid is not installed"
    elif not weights.is_file():
        why = f"no {weights}"
    else:
        return StandardNet("inception-fid", True, str(weights))
    return StandardNet("inception-fid", False, f"Inception FID unavailable offline: {why} (nothing is downloaded)")


def _clip() -> StandardNet:
    if not importlib.util.find_spec("transformers") or not importlib.util.find_spec("huggingface_hub"):
        return StandardNet("clip", False, "CLIP score unavailable offline: transformers is not installed")
    from huggingface_hub import try_to_load_from_cache

    for repo in CLIP_REPOS:  # cache lookup only: never contacts the Hub
        cfg, weights = (try_to_load_from_cache(repo, f) for f in ("config.json", "model.safetensors"))
        if isinstance(cfg, str) and isinstance(weights, str):
            return StandardNet("clip", True, repo)
    return StandardNet("clip", False, f"CLIP score unavailable offline: none of {', '.join(CLIP_REPOS)} "
                                      "is in the local Hugging Face cache (nothing is downloaded)")


def optional_standard_metrics() -> dict[str, StandardNet]:
    """Which standard metric networks have local weights: {"inception-fid": ..., "clip": ...}; never downloads."""
    return {s.name: s for s in (_inception(), _clip())}


@torch.no_grad()
def clip_score(images: torch.Tensor, texts: list[str], model: str, batch_size: int = 32) -> float:
    """Mean 100 * cosine(CLIP image, CLIP text) for images [N,3,H,W] in [-1,1]; `model` = local repo id or folder."""
    from transformers import CLIPModel, CLIPProcessor

    if len(texts) != len(images):
        raise ValueError(f"clip_score needs one text per image, got {len(texts)} texts for {len(images)} images")
    net = CLIPModel.from_pretrained(model, local_files_only=True).eval()
    proc = CLIPProcessor.from_pretrained(model, local_files_only=True)
    scores = []
    for i in range(0, len(images), batch_size):
        pix = ((images[i : i + batch_size].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)  # [b,3,H,W]
        inp = proc(text=texts[i : i + batch_size], images=list(pix), return_tensors="pt", padding=True)
        out = net(input_ids=inp["input_ids"], attention_mask=inp["attention_mask"], pixel_values=inp["pixel_values"])
        img, txt = F.normalize(out.image_embeds, dim=-1), F.normalize(out.text_embeds, dim=-1)  # [b,D] each
        scores.append(100 * (img * txt).sum(-1).clamp_min(0))  # paired image i <-> text i, as CLIPScore
    return float(torch.cat(scores).mean())
