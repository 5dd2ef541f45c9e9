"""Rotary position tables (1D Llama and LlamaGen 2D) and their application in two layouts.

A table is a tensor [P, D/2, 2] of (cos, sin) indexed by *position id*, so the model looks up any
positions it is given (tree nodes share positions; LlamaGen's condition tokens map to zero rows).

Layouts of the rotated pairs inside a head of width D:
- "half": pairs are (x[i], x[i + D/2]) (HF `rotate_half`, NeoX; HF Llama/Qwen2 safetensors, GGUF qwen2).
- "interleaved": pairs are (x[2i], x[2i+1]) (Meta/gpt-fast, GGUF llama, LlamaGen).
"""

from __future__ import annotations

import torch


def inv_freq(dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies [dim/2] for a rotary dimension `dim`."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))


def table_1d(max_pos: int, head_dim: int, theta: float) -> torch.Tensor:
    """Standard Llama table [max_pos, head_dim/2, 2]."""
    angles = torch.outer(torch.arange(max_pos).float(), inv_freq(head_dim, theta))
    return torch.stack([angles.cos(), angles.sin()], dim=-1).float()


def table_2d(grid: int, head_dim: int, theta: float, n_cond: int) -> torch.Tensor:
    """LlamaGen 2D table [n_cond + grid*grid, head_dim/2, 2].

    The first half of the rotated pairs encodes the row, the second half the column, each with
    frequencies of a head_dim/2 rotary space. Condition positions are all-zero rows (LlamaGen
    concatenates zeros, so condition queries/keys are zeroed by the rotation, as in its code).
    """
    half = head_dim // 2
    freqs = torch.outer(torch.arange(grid).float(), inv_freq(half, theta))  # [grid, half/2]
    rows = freqs[:, None, :].expand(grid, grid, -1)
    cols = freqs[None, :, :].expand(grid, grid, -1)
    angles = torch.cat([rows, cols], dim=-1).reshape(grid * grid, half)  # [grid², head_dim/2]
    table = torch.stack([angles.cos(), angles.sin()], dim=-1).float()
    return torch.cat([torch.zeros(n_cond, half, 2), table], dim=0)


def apply_rope(x: torch.Tensor, rot: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate x [B, H, S, D] with rot [B, S, D/2, 2] (cos, sin) in the given pair layout."""
    cos, sin = rot[..., 0].unsqueeze(1), rot[..., 1].unsqueeze(1)  # [B, 1, S, D/2]
    if layout == "half":
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
