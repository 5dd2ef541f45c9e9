"""RoPE tables [P, D/2, 2] of (cos, sin) by position id (1D Llama with context extension, LlamaGen 2D) and rotation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specgen.models import kernel_choice

SCALINGS = ("linear", "llama3", "factors", "longrope", "yarn")  # the `rope_type`s a table can carry
#: rope_type -> its key holding one number a frequency (TransformerConfig checks their count and sign)
PER_FREQUENCY = {"factors": ("factors",), "longrope": ("short_factor", "long_factor")}


def inv_freq(dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies [dim/2] for a rotary dimension `dim`."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))


def scaled_inv_freq(dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [dim/2] and the cos/sin (attention) factor of a context-extended RoPE ("linear", "llama3",
    "yarn"), with transformers' float32 operations so the tables agree bit for bit; "factors": each frequency divided
    by its own stored factor (a GGUF's `rope_freqs.weight`, as llama.cpp applies it); "longrope": its short factors,
    which transformers uses while a sequence is within `original_max_position_embeddings` (the context is capped
    there: past it transformers switches every position to the long factors)."""
    kind, base = scaling["rope_type"], inv_freq(dim, theta)
    if kind == "linear":
        return base / scaling["factor"], 1.0
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / base
        out = torch.where(wavelen > old / low, base / factor, base)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, out), 1.0
    if kind == "factors":
        return base / torch.tensor(scaling["factors"], dtype=torch.float32), 1.0
    if kind == "longrope":
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * theta**shape), \
            scaling["attention_factor"]
    # yarn: the last of SCALINGS (TransformerConfig admits no other kind)
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling["beta_fast"]), correction_dim(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low or 0.001), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (the original frequency), 0: interpolate (divided by factor)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep, scaling["attention_factor"]


def table_1d(max_pos: int, head_dim: int, theta: float, scaling: dict | None = None, rotary_dim: int = 0
             ) -> torch.Tensor:
    """Standard Llama table [max_pos, head_dim/2, 2]; `scaling` (see `scaled_inv_freq`) extends its context. Partial
    RoPE (`rotary_dim` < head_dim): the first rotary_dim/2 pairs rotate at rotary_dim's frequencies, as transformers'
    Phi-3 computes them; the others are (1, 0), which leaves a pair's two dims as they are, bit for bit."""
    rotary_dim = rotary_dim or head_dim
    freq, factor = scaled_inv_freq(rotary_dim, theta, scaling) if scaling else (inv_freq(rotary_dim, theta), 1.0)
    angles = torch.outer(torch.arange(max_pos).float(), freq)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1).float() * factor  # x * 1.0 is x, bit for bit
    still = torch.tensor([1.0, 0.0]).expand(max_pos, (head_dim - rotary_dim) // 2, 2)  # x * 1 + y * 0 is x
    return torch.cat([table, still], dim=1)


def spread_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Partial RoPE as whole-head RoPE: the order [head_dim] of a head's q/k dims that puts transformers' rotary
    pairs (i, i + rotary_dim/2) at the kernels' (i, i + head_dim/2) and the unrotated dims in the pairs `table_1d`
    leaves still. Attention sums q . k over a head's dims, so ordering q's and k's alike changes no score; loaders
    store q/k rows (and their norms) in this order, the `hf` export undoes it."""
    half, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    dims = torch.arange(head_dim)
    first, second = dims[:half], dims[half:rotary_dim]
    return torch.cat([first, dims[rotary_dim:rotary_dim + rest], second, dims[rotary_dim + rest:]])


def table_2d(grid: int, head_dim: int, theta: float, n_cond: int) -> torch.Tensor:
    """LlamaGen 2D table [n_cond + grid*grid, head_dim/2, 2]: the first half of the pairs encodes the row, the second
    the column; condition positions are all-zero rows (as LlamaGen's, which zero condition queries and keys)."""
    half = head_dim // 2
    freqs = torch.outer(torch.arange(grid).float(), inv_freq(half, theta))  # [grid, half/2]
    rows, cols = freqs[:, None, :].expand(grid, grid, -1), freqs[None, :, :].expand(grid, grid, -1)
    angles = torch.cat([rows, cols], dim=-1).reshape(grid * grid, half)  # [grid², head_dim/2]
    table = torch.stack([angles.cos(), angles.sin()], dim=-1).float()
    return torch.cat([torch.zeros(n_cond, half, 2), table], dim=0)


def per_head(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows [heads * D, ...] (a projection's, its bias, a per-head norm's [D]) with each head's D rows in `order`."""
    return rows.unflatten(0, (-1, len(order)))[:, order].flatten(0, 1)


@dataclass(frozen=True)
class Rotation:
    """A forward's rotation, made once and used by every layer: `cos` [B, 1, S, D] and `sin` [B, 1, S, D] with each
    pair's (cos, sin) spread over the pair's two slots and sin negated on the slot whose partner is subtracted."""

    cos: torch.Tensor
    sin: torch.Tensor
    layout: str  # "half": pairs (x[i], x[i + D/2]) (HF, NeoX) | "interleaved": (x[2i], x[2i+1]) (Meta)

    def split(self, qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of a forward's qkv [B, Hq + 2 Hkv, S, D], q and k rotated together: [B, Hq | Hkv, S, D]."""
        hkv = (qkv.shape[1] - heads) // 2
        qk = rotate(qkv[:, : heads + hkv], self)
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + hkv :]


def rotation(rot: torch.Tensor, layout: str) -> Rotation:
    """The Rotation of table rows rot [B, S, D/2, 2] (cos, sin) in a pair layout."""
    cos, sin = rot[..., 0].unsqueeze(1), rot[..., 1].unsqueeze(1)  # [B, 1, S, D/2]
    if layout == "half":
        return Rotation(torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1), layout)
    return Rotation(torch.stack([cos, cos], -1).flatten(-2), torch.stack([-sin, sin], -1).flatten(-2), layout)


def layout_table(table: torch.Tensor, layout: str) -> torch.Tensor:
    """A (cos, sin) table [P, D/2, 2] as each position's Rotation rows [P, 2, D] (cos, then the signed sin): a
    forward's rotation is one gather of its positions' rows (`rows_rotation`), with `rotation`'s bits in any dtype
    (a cast rounds -s to -round(s))."""
    r = rotation(table[None], layout)  # cos, sin [1, 1, P, D]
    return torch.stack([r.cos[0, 0], r.sin[0, 0]], 1)


def rows_rotation(rows: torch.Tensor, layout: str) -> Rotation:
    """The Rotation of `layout_table` rows [B, S, 2, D]: cos and sin [B, 1, S, D] as views (one stride set for both,
    as the CUDA kernels read them)."""
    return Rotation(rows[:, None, :, 0], rows[:, None, :, 1], layout)


def still(r: Rotation) -> Rotation:
    """A rotation of `r`'s shape, dtype and layout that turns nothing: cos 1, sin 0, so each slot is x * 1 + partner *
    0, which is x bit for bit (finite x): a layer without RoPE (SmolLM3's NoPE layers) through the same kernels."""
    cos = torch.ones_like(r.cos[:, 0])  # [B, S, D]
    return rows_rotation(torch.stack([cos, torch.zeros_like(cos)], 2), r.layout)  # rows [B, S, 2, D]


def rotate(x: torch.Tensor, r: Rotation) -> torch.Tensor:
    """x [B, H, S, D] rotated: each pair (a, b) -> (a cos - b sin, b cos + a sin), computed as x * cos + partner(x) *
    sin, where partner(x) swaps the two slots of every pair. Bitwise the per-pair formula: b * (-sin) is -(b sin)
    exactly and a + (-y) is a - y, so each slot sees the same two rounded products and one rounded sum. On CUDA one
    Triton pass computes those same products and sum (native/cuda_ops.py)."""
    if kernel_choice.one_pass(x):
        return torch.ops.specgen.rope(x, r.cos, r.sin, r.layout == "half")
    d = x.shape[-1]
    partner = x.roll(d // 2, -1) if r.layout == "half" else x.unflatten(-1, (d // 2, 2)).flip(-1).flatten(-2)
    return x * r.cos + partner * r.sin
