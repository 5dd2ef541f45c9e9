"""torch side of tiled.c: lay a float32 Linear weight out in tiles, and run x @ W^T + b over them (CPU, inference)."""

from __future__ import annotations

import torch

from specgen.native import ops


@torch.no_grad()
def tile(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tiles [ceil(N / T)][K][T], bias padded to ceil(N / T) * T or None) of a float32 weight [N, K], any strides;
    T = tiled.c's tile width. Zeros past N: the padded columns are computed and never written out."""
    width = ops.tile_width()
    n, k = weight.shape
    pad = -n % width
    w = torch.cat([weight, weight.new_zeros(pad, k)]) if pad else weight  # [N_pad, K]
    tiles = w.reshape(-1, width, k).transpose(1, 2).contiguous()  # [N_pad / T, K, T]
    b = None if bias is None else torch.cat([bias.detach(), bias.new_zeros(pad)]).contiguous()
    return tiles, b


def linear(x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., K] @ W^T + b -> [..., N] over `tile(W, b)`'s outputs, on torch's threads (`torch.ops.specgen`)."""
    return torch.ops.specgen.tiled_linear(x, tiles, bias, out_features, torch.get_num_threads())
