"""Speed measures combined over a run's shards: per-shard weighting, and the efficiency of speculative rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from specgen.decoding.cost import CostCurve
from specgen.decoding.stats import DecodeStats


def per_shard(runs: Sequence, shards: list[str], walls: dict, fn: Callable[[str, list, float], float | None]):
    """fn(shard, its runs, its wall) averaged over the shards of `walls`, weighted by each shard's number of runs
    (`shards`: the shard of each run); None when no shard gives a value."""
    parts = [(fn(s, [r for r, t in zip(runs, shards) if t == s], w), shards.count(s)) for s, w in walls.items()]
    parts = [(v, n) for v, n in parts if v is not None and n]
    return sum(v * n for v, n in parts) / sum(n for _, n in parts) if parts else None


def curves(machines: dict[str, dict]) -> dict[str, CostCurve]:
    """shard -> its measured cost curve c(m) (from its machine file)."""
    return {s: CostCurve(tuple(i["cost_rows"]), tuple(i["cost"])) for s, i in machines.items() if i.get("cost_rows")}


def merged(stats: list[DecodeStats]) -> DecodeStats:
    total = DecodeStats()
    for s in stats:
        total.merge(s)
    return total


def summed(shards: list[str], seconds: list[float]) -> dict[str, float]:
    """shard -> the sum of its runs' seconds: a shard's wall time when its runs are timed alone (batch 1)."""
    walls: dict[str, float] = {}
    for s, t in zip(shards, seconds):
        walls[s] = walls.get(s, 0.0) + t
    return walls


@dataclass(frozen=True)
class Timed:
    """A row's runs over a run's shards: each run's work (tokens; 1 an image or mesh) and shard, each shard's wall."""

    work: list[float]
    shards: list[str]
    walls: dict[str, float]  # shard -> seconds

    @classmethod
    def one_by_one(cls, work: list[float], shards: list[str], seconds: list[float]) -> "Timed":
        """Runs timed alone (batch 1)."""
        return cls(work, shards, summed(shards, seconds))

    def rate(self, shard: str) -> float:
        return sum(w for w, s in zip(self.work, self.shards) if s == shard) / self.walls[shard]

    def total(self) -> float:
        """The run's rate: shards run side by side, so theirs add up."""
        return sum(self.rate(s) for s in self.walls)

    def vs(self, other: "Timed") -> float | None:
        """This rate over `other`'s on the same shard, weighted by runs (`per_shard`)."""
        return per_shard(self.work, self.shards, self.walls,
                         lambda s, xs, w: self.rate(s) / other.rate(s) if s in other.walls else None)


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
