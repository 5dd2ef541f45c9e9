"""Image grids: a batch of images tiled into one RGB picture (PIL)."""

from __future__ import annotations

import torch
from PIL import Image


def image_grid(images: torch.Tensor, nrow: int = 8, pad: int = 2) -> Image.Image:
    """Tile images [N,3,H,W] in [-1,1] into an RGB PIL image: nrow per row, `pad` white pixels between tiles."""
    n, _, h, w = images.shape
    cols = max(1, min(nrow, n))
    rows = max(1, -(-n // cols))
    grid = torch.full((3, rows * (h + pad) + pad, cols * (w + pad) + pad), 255, dtype=torch.uint8)  # [3,GH,GW]
    pix = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)  # [N,3,H,W]
    for i in range(n):
        r, c = divmod(i, cols)
        top, left = pad + r * (h + pad), pad + c * (w + pad)
        grid[:, top : top + h, left : left + w] = pix[i]
    return Image.fromarray(grid.permute(1, 2, 0).contiguous().numpy())  # uint8 [GH,GW,3] -> RGB
