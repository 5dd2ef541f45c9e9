"""Speed measures combined over a run's shards: per-shard weighting, and the efficiency of speculative rows.

A time is only ever divided by one from the same shard (docs/benchmarks.md, "Records and rows")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from specgen.decoding.cost import CostCurve


def per_shard(runs: Sequence, shards: list[str], walls: dict, fn: Callable[[str, list, float], float | None]):
    """fn(shard, its runs, its wall) averaged over the shards of `walls`, weighted by each shard's number of runs
    (`shards`: the shard of each run); None when no shard gives a value."""
    parts = [(fn(s, [r for r, t in zip(runs, shards) if t == s], w), shards.count(s)) for s, w in walls.items()]
    parts = [(v, n) for v, n in parts if v is not None and n]
    return sum(v * n for v, n in parts) / sum(n for _, n in parts) if parts else None


@dataclass(frozen=True)
class Drafting:
    """One shard's verify steps of a speculative row, and what one AR forward takes on that shard."""

    runs: int
    steps: int
    verify_tokens: int  # fed to the verify forwards (per sequence: a CFG image feeds `branches` rows each)
    accepted: int
    draft_seconds: float
    ar_forward_seconds: float
    cost: CostCurve  # the shard's c(m), relative to one row
    branches: int = 1

    @property
    def drafts(self) -> bool:
        return bool(self.steps) and self.verify_tokens > self.steps


def efficiency(shards: list[Drafting], speedup: float) -> dict:
    """eta = speedup / predicted, predicted = tau / (c(b N) / c(b) + d) per shard, weighted by runs: N = tokens per
    verify, b = rows per token (CFG branches), d = drafter seconds per step over an AR forward's. {} without shards."""
    parts = []
    for s in shards:
        n, d = s.verify_tokens / s.steps, s.draft_seconds / s.steps / s.ar_forward_seconds
        tau = (s.accepted + s.steps) / s.steps
        parts.append((tau / (s.cost(s.branches * n) / s.cost(s.branches) + d), s.runs, n, d))
    if not parts:
        return {}
    count = sum(p[1] for p in parts)
    predicted = sum(p[0] * p[1] for p in parts) / count
    return {"verify_tokens": round(sum(p[2] * p[1] for p in parts) / count, 3),
            "draft_cost": round(sum(p[3] * p[1] for p in parts) / count, 4),
            "predicted_speedup": round(predicted, 4), "efficiency": round(speedup / predicted, 4)}
