"""torch side of tiled.c: lay a float32 Linear weight out in tiles, and run x @ W^T + b over them (CPU, inference)."""

from __future__ import annotations

import torch

from specgen.native import tiled


def available() -> bool:
    """Whether tiled.c was built on this machine (a C compiler, `SPECGEN_NATIVE` not 0)."""
    return tiled() is not None


def threads() -> int:
    """How many threads a large product runs on now: torch's thread count in an OpenMP build, else 1."""
    return torch.get_num_threads() if tiled().specgen_tiled_openmp() else 1


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a product of x and weight may run here: float32 both, on the CPU, no gradient wanted."""
    return (available() and x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
            and not torch.is_grad_enabled())


@torch.no_grad()
def tile(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tiles [ceil(N / T)][K][T], bias padded to ceil(N / T) * T or None) of a float32 weight [N, K], any strides;
    T = tiled.c's tile width. Zeros past N: the padded columns are computed and never written out."""
    width = tiled().specgen_tiled_width()
    n, k = weight.shape
    pad = -n % width
    w = torch.cat([weight, weight.new_zeros(pad, k)]) if pad else weight  # [N_pad, K]
    tiles = w.reshape(-1, width, k).transpose(1, 2).contiguous()  # [N_pad / T, K, T]
    b = None if bias is None else torch.cat([bias.detach(), bias.new_zeros(pad)]).contiguous()
    return tiles, b


def linear(x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., K] @ W^T + b -> [..., N] over `tile(W, b)`'s outputs. Each output row is a fixed function of its input
    row (tiled.c: the same sums at every row count)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
    out = linear_rows(rows, tiles, bias, out_features, torch.get_num_threads())
    return out.reshape(*x.shape[:-1], out_features)


def linear_rows(x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                threads: int) -> torch.Tensor:
    """`linear` of contiguous float32 x [..., K] as rows: [M, N] (M = x.numel() / K), on `threads` threads."""
    k = tiles.shape[1]
    m = x.numel() // k
    out = torch.empty(m, out_features, dtype=x.dtype)
    tiled().specgen_tiled_linear(x.data_ptr(), tiles.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                 out.data_ptr(), m, k, out_features, threads)
    return out
