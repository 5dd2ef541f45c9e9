"""Caption features for text-conditional (t2i) LlamaGen models: read a file, left-pad to the model's slots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from specgen.data.arrays import read_npy
from specgen.errors import IncompatibleError, UsageError

SUFFIXES = (".safetensors", ".npz", ".npy")


@dataclass(frozen=True)
class Caption:
    """One left-padded caption: what a t2i model is conditioned on."""

    features: torch.Tensor  # [n_cond, caption_dim] float32; zero at padded slots
    valid: torch.Tensor  # [n_cond] bool; False = padded slot (never attended)
    index: int = 0  # row in the features file


def left_pad(features: torch.Tensor, mask: torch.Tensor, n_cond: int) -> list[Caption]:
    """Captions from features [N, L, C] and mask [N, L] bool, real tokens moved to the last slots of n_cond: the last
    slot, which predicts image token 0, is always a real token (padding goes first, masked)."""
    out = []
    for i in range(features.shape[0]):
        real = features[i][mask[i]].float()  # [k, C], in order
        k = real.shape[0]
        padded = torch.cat([real.new_zeros(n_cond - k, real.shape[1]), real])  # [n_cond, C]
        out.append(Caption(padded, torch.arange(n_cond) >= n_cond - k, i))
    return out


def read_captions(path: str | Path, n_cond: int, caption_dim: int) -> list[Caption]:
    """Validated, left-padded captions from a features file; every problem is a one-line usage error."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UsageError(f"caption features must be one of {', '.join(SUFFIXES)}, got {path.name}")
    if not path.is_file():
        raise UsageError(f"caption features file not found: {path}")
    if path.suffix == ".npy":  # a file that is not one, or of Python objects, refused as such (no pickles)
        arrays = {"features": torch.from_numpy(read_npy(path, "caption features [B, M, C] (or [M, C])"))}
    else:
        arrays = read_arrays(path)
    if "features" not in arrays:
        raise UsageError(f"{path.name} has no 'features' array (found: {', '.join(sorted(arrays)) or 'none'})")
    features = arrays["features"]
    if features.dim() == 2:
        features = features.unsqueeze(0)
    if features.dim() != 3 or not features.is_floating_point():
        raise UsageError(f"{path.name}: features must be a float array [N, L, caption_dim], "
                         f"got {features.dtype} {list(arrays['features'].shape)}")
    n, length, dim = features.shape
    if n < 1 or length < 1:
        raise UsageError(f"{path.name}: no captions (features {list(features.shape)})")
    if length > n_cond:
        raise UsageError(f"{path.name}: captions have {length} token slots; the model takes at most {n_cond}")
    if dim != caption_dim:
        raise IncompatibleError(f"{path.name}: caption features are {dim} wide but the model expects {caption_dim}")
    mask = arrays.get("mask", torch.ones(n, length, dtype=torch.bool))
    mask = mask.unsqueeze(0) if mask.dim() == 1 and n == 1 else mask
    if tuple(mask.shape) != (n, length):
        raise UsageError(f"{path.name}: mask must be [N, L] = {[n, length]}, got {list(mask.shape)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise UsageError(f"{path.name}: mask must be bool or 0/1 integers")
        mask = mask.bool()
    counts = mask.sum(1)
    if int(counts.min()) == 0:
        raise UsageError(f"{path.name}: caption {int(counts.argmin())} has no valid token (mask all false)")
    if not bool(torch.isfinite(features[mask]).all()):
        bad = int((~torch.isfinite(features) & mask[..., None]).flatten(1).any(1).nonzero()[0])
        raise UsageError(f"{path.name}: caption {bad} has NaN or infinite features")
    return left_pad(features, mask, n_cond)


def read_arrays(path: Path) -> dict[str, torch.Tensor]:
    """The arrays of a .safetensors or .npz file (no pickles: allow_pickle=False); a corrupt file is one line."""
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        with np.load(path, allow_pickle=False) as z:
            return {k: torch.from_numpy(z[k]) for k in z.files}
    except Exception as e:  # corrupt file, wrong format, object arrays
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"cannot read caption features {path.name}: {detail}") from None
