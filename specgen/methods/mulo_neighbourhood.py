"""MuLo-SD local rejection sets (Sec. 3.3, Eqs. 6-7): which positions of a drafted block are re-sampled."""

from __future__ import annotations

from collections.abc import Iterable

from specgen.methods.options import MULO_REJECTIONS

REJECTIONS = MULO_REJECTIONS


def neighbourhood(t: int, t0: int, radius: int, width: int, start: int, end: int) -> list[int]:
    """N(t, l) of Eq. 6, clipped to the grid's columns and to the block [start, end); sorted."""
    i, j = divmod(t, width)
    out = []
    for row in range(i - radius, i + radius + 1):
        for col in range(max(0, j - radius), min(width - 1, j + radius) + 1):
            u = row * width + col
            if row >= 0 and u >= t0 and start <= u < end:
                out.append(u)
    return out


def expand_rejections(rejected: Iterable[int], radius: int, width: int, start: int, end: int,
                      mode: str = "local") -> list[int]:
    """R_X (sorted) for rejected positions R_T: local expansion of radius l (Eq. 7), or raster [t_0, end)."""
    rejected = sorted(set(rejected))
    if not rejected:
        return []
    if mode not in REJECTIONS:
        raise ValueError(f"rejection mode must be one of {REJECTIONS}, got {mode!r}")
    if radius < 0 or width < 1:
        raise ValueError(f"need radius >= 0 and width >= 1 (got {radius}, {width})")
    t0 = rejected[0]
    if not (start <= t0 and rejected[-1] < end):
        raise ValueError(f"rejected positions must lie in the block [{start}, {end})")
    if mode == "raster":
        return list(range(t0, end))
    out: set[int] = set()
    for t in rejected:
        out.update(neighbourhood(t, t0, radius, width, start, end))
    return sorted(out)
