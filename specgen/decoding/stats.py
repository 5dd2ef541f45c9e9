"""Decoding statistics: NFE, acceptance, tree depth, wall time per phase, and the rates of docs/benchmarks.md."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated


@dataclass
class DecodeStats:
    """Counters of one (or, after `merge`, several) decoding runs."""

    new_tokens: int = 0
    target_forwards: int = 0
    target_tokens: int = 0  # tokens fed to the target, prefill excluded
    drafter_forwards: int = 0
    steps: int = 0  # verify steps (prefill excluded)
    accepted: list[int] = field(default_factory=list)  # per step: draft tokens accepted
    draft_sizes: list[int] = field(default_factory=list)  # per step: nodes in the draft
    depths: list[int] = field(default_factory=list)  # per step: draft-tree depth
    # phase -> seconds; a row that ends before a phase runs again has 0 of it, its wall time is never 0 (bounds
    # checked on a record read back: eval/json_shape.BOUNDS)
    times: Annotated[dict[str, Annotated[float, ">= 0"]], "sum > 0"] = field(default_factory=dict)
    extras: dict[str, float] = field(default_factory=dict)  # method-specific counters

    def record(self, size: int, depth: int, accepted: int) -> None:
        """Count one verify step: its draft's size and depth, and the draft tokens accepted."""
        self.steps += 1
        self.draft_sizes.append(size)
        self.depths.append(depth)
        self.accepted.append(accepted)

    def merge(self, other: "DecodeStats") -> None:
        """Add `other`'s counters to these: counts add, per-step lists concatenate, per-name seconds/counters add."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0.0) + v
            else:
                setattr(self, f.name, mine + theirs)

    @property
    def wall_time(self) -> float:
        return sum(self.times.values())

    @property
    def tau(self) -> float:
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else 0.0

    @property
    def tpf(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def d_bar(self) -> float:
        return sum(self.depths) / len(self.depths) if self.depths else 0.0

    @property
    def drafter_share(self) -> float:
        return self.times.get("propose", 0.0) / self.wall_time if self.wall_time else 0.0

    def summary(self) -> dict[str, float]:
        """Flat JSON-ready numbers with units in the key names."""
        return {
            "new_tokens": self.new_tokens,
            "nfe": self.target_forwards,
            "tpf": round(self.tpf, 4),
            "tau": round(self.tau, 4),
            "d_bar": round(self.d_bar, 4),
            "drafter_forwards": self.drafter_forwards,
            "wall_s": round(self.wall_time, 4),
            "tokens_per_s": round(self.new_tokens / self.wall_time if self.wall_time else 0.0, 3),
            "drafter_share": round(self.drafter_share, 4),
            **{f"time_{k}_s": round(v, 4) for k, v in sorted(self.times.items())},
            **{k: round(v, 4) for k, v in sorted(self.extras.items())},
        }
