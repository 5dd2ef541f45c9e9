"""Coordinate-factored token table for training the mesh GPT: table = free + features @ axes, folded at export."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from specgen.mesh.tokenizers import BPTTokenizer


def token_features(tok: BPTTokenizer) -> torch.Tensor:
    """One-hot features [V, F] of every id: 4 kinds, then block x/y/z (blocks and special blocks),
    then offset x/y/z. F = 4 + 3 * block_size + 3 * offset_size (76 for the default 8 x 16)."""
    b, o, v = tok.block_size, tok.offset_size, tok.vocab_size
    ids = np.arange(v)
    kind = tok.kinds(ids).astype(np.int64)  # [V]
    feats = np.zeros((v, 4 + 3 * b + 3 * o), dtype=np.float32)
    feats[ids, kind] = 1.0
    # kind, its first id, cells per axis, first column: blocks and special blocks share coordinates
    for k, lo_id, s, col in ((0, 0, b, 4), (2, tok.special_base, b, 4), (1, tok.offset_base, o, 4 + 3 * b)):
        cell = ids[kind == k] - lo_id  # [512] or [4096]
        for axis, c in enumerate((cell // (s * s), cell // s % s, cell % s)):
            feats[ids[kind == k], col + axis * s + c] = 1.0
    return torch.from_numpy(feats)


class FactoredTable(nn.Module):
    """table(free) = free + features @ axes; `axes` [F, dim] is the only parameter."""

    def __init__(self, tok: BPTTokenizer, dim: int, std: float = 0.02) -> None:
        super().__init__()
        self.register_buffer("features", token_features(tok), persistent=False)  # [V, F]
        self.axes = nn.Parameter(torch.randn(self.features.shape[1], dim) * std)  # [F, dim]

    def forward(self, free: torch.Tensor) -> torch.Tensor:
        return free + self.features @ self.axes  # [V, dim]

    @torch.no_grad()
    def fold(self, embedding: nn.Embedding) -> None:
        """Overwrite `embedding` (the free part, in place) with the full table: a plain model then computes
        what the reparametrised one did."""
        embedding.weight.copy_(self(embedding.weight))
