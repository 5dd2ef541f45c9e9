"""Which items a process owns: `--shard I/N`, or a launcher's RANK and WORLD_SIZE (torchrun, accelerate)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from specgen.errors import UsageError


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based): it owns the items whose position i has i % count == index."""

    index: int = 0
    count: int = 1

    @property
    def label(self) -> str:
        return f"{self.index}-of-{self.count}"


def parse_shard(text: str) -> Shard:
    """'I/N' (0 <= I < N, the Slurm array form `$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`) -> Shard; ASCII digits
    only (int() would also read spaces, signs and other scripts' digits)."""
    parts = re.fullmatch(r"([0-9]+)/([0-9]+)", text)
    if parts is None:
        raise UsageError(f"--shard takes I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    shard = Shard(int(parts[1]), int(parts[2]))
    if shard.count < 1 or not 0 <= shard.index < shard.count:
        raise UsageError(f"--shard {text}: the shard index must satisfy 0 <= I < N (e.g. 0/4 .. 3/4)")
    return shard


def launcher_shard() -> Shard | None:
    """The shard of this process under `torchrun` / `accelerate launch` (RANK, WORLD_SIZE), else None."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return Shard(int(rank), int(world)) if int(world) > 1 else None
    except ValueError:
        raise UsageError(f"RANK={rank!r} / WORLD_SIZE={world!r} from the launcher are not integers") from None
