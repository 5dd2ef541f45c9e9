"""MuLo-SD local rejection sets (Sec. 3.3, Eqs. 6-7): which positions of a drafted block are re-sampled."""

from __future__ import annotations

from collections.abc import Iterable


def neighbourhood(t: int, t0: int, radius: int, width: int, start: int, end: int) -> list[int]:
    """N(t, l) of Eq. 6, clipped to the grid's columns and to the block [start, end); sorted."""
    i, j = divmod(t, width)
    cells = (r * width + c for r in range(max(0, i - radius), i + radius + 1)
             for c in range(max(0, j - radius), min(width - 1, j + radius) + 1))
    return [u for u in cells if max(t0, start) <= u < end]


def expand_rejections(rejected: Iterable[int], radius: int, width: int, start: int, end: int,
                      mode: str = "local") -> list[int]:
    """R_X (sorted) for rejected positions R_T in the block [start, end): local expansion of radius l (Eq. 7), or
    raster [t_0, end) (`mode` and `radius` as `MuloOptions` checked them)."""
    rejected = sorted(set(rejected))
    if not rejected:
        return []
    t0 = rejected[0]
    if mode == "raster":
        return list(range(t0, end))
    out: set[int] = set()
    for t in rejected:
        out.update(neighbourhood(t, t0, radius, width, start, end))
    return sorted(out)
