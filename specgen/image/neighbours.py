"""LANTERN latent-neighbour tables: k nearest VQ codebook entries per code, cached by codebook hash."""

from __future__ import annotations

import hashlib
import warnings

import torch

from specgen import registry
from specgen.errors import UsageError
from specgen.tensor_files import cached_tensors


def codebook_hash(codebook: torch.Tensor) -> str:
    data = codebook.detach().float().cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def compute_neighbours(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] int64 indices of the k nearest other codes, nearest first (Euclidean on the raw weights, as LANTERN)."""
    cb = codebook.detach().float()
    d = torch.cdist(cb, cb)
    d.fill_diagonal_(float("inf"))
    k = min(k, cb.shape[0] - 1)
    return d.topk(k, dim=-1, largest=False).indices


def neighbour_table(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """The table for this codebook and k, cached (a corrupt cache file is recomputed)."""
    path = registry.home() / "artefacts" / "neighbours" / f"{codebook_hash(codebook)}-k{k}.safetensors"
    try:
        return cached_tensors(path, lambda: {"neighbours": compute_neighbours(codebook, k)})["neighbours"]
    except UsageError as e:  # the cache folder cannot be written (checked before the work): computed, not cached
        warnings.warn(f"the LANTERN neighbour table is not cached ({e}); each start computes it again", stacklevel=2)
        return compute_neighbours(codebook, k)


def scaled_k(vocab: int, k_ref: int = 1000, vocab_ref: int = 16384) -> int:
    """LANTERN's k = 1000 on a 16,384-code codebook, scaled to this codebook's size (at least 1)."""
    return max(1, round(k_ref * vocab / vocab_ref))
