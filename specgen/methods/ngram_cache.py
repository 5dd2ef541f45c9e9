"""A static n-gram cache: how a target's own greedy answers continued each n-gram, as drafts for `ngram`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from specgen import registry
from specgen.errors import CheckpointError, UsageError
from specgen.paths import atomic_write

MAX_NGRAM, MIN_NGRAM = 4, 2  # n-gram lengths looked up, longest first
MIN_COUNT, MIN_SHARE = 2, 0.5  # an entry: seen at least this often, and this share of its n-gram's continuations
SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "text" / "ngram"  # <name>.safetensors


@dataclass(frozen=True)
class NgramCache:
    """n-gram (a tuple of MIN_NGRAM..MAX_NGRAM token ids) -> the token that most often followed it."""

    table: dict[tuple[int, ...], int] = field(repr=False)

    def draft(self, seq: list[int], k: int) -> list[int]:
        """Up to k tokens, each the cached continuation of the longest suffix of the sequence drafted so far."""
        out, drafted = list(seq[-MAX_NGRAM:]), []
        while len(drafted) < k:
            hits = (self.table.get(tuple(out[-n:])) for n in range(min(MAX_NGRAM, len(out)), MIN_NGRAM - 1, -1))
            nxt = next((hit for hit in hits if hit is not None), None)
            if nxt is None:
                break
            drafted.append(nxt)
            out.append(nxt)
        return drafted


def joined(answers: list[list[int]]) -> np.ndarray:
    """Token streams as one int64 array, each followed by -1 (the cache file's layout)."""
    return np.array([t for seq in answers for t in (*seq, -1)], dtype=np.int64)


def table_of(flat: np.ndarray) -> dict[tuple[int, ...], int]:
    """n-gram -> its continuation for every n-gram of streams `flat` (joined by -1) followed at least MIN_COUNT times
    and for at least MIN_SHARE of its continuations by one token: the most frequent, ties going to the continuation
    seen first (a Counter's most_common over the streams in order)."""
    table = {}
    for n in range(MIN_NGRAM, MAX_NGRAM + 1):
        if len(flat) <= n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(flat, n + 1)  # [M, n + 1]: n-gram, next
        windows = windows[(windows >= 0).all(axis=1)]  # within one stream
        if not len(windows):
            continue
        seen = np.lexsort((np.arange(len(windows)), *windows.T[::-1]))  # [M]: by n-gram, next, then position
        starts = np.flatnonzero(np.r_[True, (windows[seen[1:]] != windows[seen[:-1]]).any(axis=1)])  # [P]
        pairs, first = windows[seen[starts]], seen[starts]  # each (n-gram, next) once [P, n + 1], where seen first
        counts = np.diff(np.r_[starts, len(seen)])  # [P]
        group = np.cumsum(np.r_[True, (pairs[1:, :n] != pairs[:-1, :n]).any(axis=1)]) - 1  # [P]: each pair's n-gram
        totals = np.bincount(group, weights=counts)  # [G]
        order = np.lexsort((first, -counts, group))  # per n-gram: most frequent first, then seen first
        best = order[np.r_[True, group[order][1:] != group[order][:-1]]]  # [G]
        keep = best[(counts[best] >= MIN_COUNT) & (counts[best] >= MIN_SHARE * totals[group[best]])]
        table.update((tuple(row[:n]), row[n]) for row in pairs[keep].tolist())
    return table


def save(path: Path, answers: list[list[int]], tokenizer: str, how: str) -> None:
    """Write answers (token streams) as a cache file, atomically: an interrupted build (an hour of decoding; the
    shipped asset) leaves the earlier file whole."""
    tokens = {"tokens": torch.from_numpy(joined(answers)).int()}
    atomic_write(path, lambda tmp: registry.save_safetensors(tokens, tmp, {"tokenizer": tokenizer, "how": how}, path))


def check_tokenizer(ref: str, tokenizer: str) -> None:
    """One line when the cache `ref` was made by another tokenizer than the target's (its header only: a refusal
    builds no table)."""
    path, made_by = read(ref, tokens=False)[:2]
    if tokenizer != made_by:
        raise UsageError(f"n-gram cache {path} was made with another tokenizer ({made_by}) than the target's "
                         f"({tokenizer}); build one for this model (python -m specgen.text.ngram_cache)")


def read(ref: str, tokens: bool = True) -> tuple[Path, str, np.ndarray]:
    """(path, tokenizer hash, the token streams joined by -1 when `tokens`) of a cache by shipped name
    (`specgen/assets/text/ngram/<name>.safetensors`) or file path; one line if neither, or if unreadable."""
    path = SHIPPED / f"{ref}.safetensors" if "/" not in ref and not ref.endswith(".safetensors") else Path(ref)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.safetensors"))) or "none"
        raise UsageError(f"no n-gram cache {ref!r}: give a shipped name ({shipped}) or a .safetensors file")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            flat = f.get_tensor("tokens").numpy().astype(np.int64) if tokens else np.zeros(0, np.int64)
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise CheckpointError(f"cannot read n-gram cache {path}: {e}") from None
    if "tokenizer" not in meta:
        raise CheckpointError(f"{path} is not an n-gram cache (no tokenizer in its metadata)")
    return path, meta["tokenizer"], flat


@lru_cache(maxsize=4)
def load(ref: str) -> NgramCache:
    """The cache `ref` (`read`) with its table built."""
    return NgramCache(table_of(read(ref)[2]))
