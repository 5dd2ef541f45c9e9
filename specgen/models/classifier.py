"""The small CNN whose features give the image benchmark's clf-FID and class accuracy (`image/metrics.py`)."""

from __future__ import annotations

import torch
import torch.nn as nn


def _block(c_in: int, c_out: int, stride: int, groups: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.GroupNorm(groups, c_out), nn.SiLU())


class ImageClassifier(nn.Module):
    """Small CNN for [B,3,S,S] images in [-1,1]: per width a stride-2 block then a stride-1 block, mean-pool."""

    def __init__(self, num_classes: int = 16, widths: tuple[int, ...] | list[int] = (32, 64, 128), groups: int = 8,
                 image_size: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_classes, self.image_size, self.feature_dim = num_classes, image_size, widths[-1]
        layers = []
        for c, w in zip((3, *widths), widths):
            layers += [_block(c, w, 2, groups), _block(w, w, 1, groups)]
        self.body = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(widths[-1], num_classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Penultimate features: [B,3,S,S] -> [B,F] (mean-pooled last block)."""
        return self.body(images).mean(dim=(2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class logits: [B,3,S,S] -> [B,num_classes]."""
        return self.head(self.dropout(self.features(images)))
