"""Benchmark figures: the speed-vs-quality scatter (a PNG written atomically; matplotlib, no pyplot)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from specgen.paths import atomic_write


def speed_quality_plot(rows: Sequence[Mapping], y: str = "fid", path: str | os.PathLike = "speed_quality.png",
                       title: str | None = None) -> Path:
    """Scatter of speedup_vs_ar vs `y`, a point per row that has both, annotated with its method; returns the path."""
    from matplotlib.figure import Figure  # optional dependency; no pyplot: no global state, no GUI backend

    x = "speedup_vs_ar"
    pts = [(float(r[x]), float(r[y]), str(r.get("method", ""))) for r in rows
           if r.get(x) is not None and r.get(y) is not None]
    fig = Figure(figsize=(5.5, 4.0), dpi=120)
    ax = fig.add_subplot()
    for px, py, name in pts:
        ax.scatter([px], [py], s=36)
        ax.annotate(name, (px, py), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")  # the AR baseline's speed
    ax.set_xlabel(x)
    ax.set_ylabel(f"{y} (lower is better)")
    ax.set_title(title or f"{y} vs {x}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"), keep_suffix=True, mode=0o644)
