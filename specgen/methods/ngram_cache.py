"""A static n-gram cache: how a target's own greedy answers continued each n-gram, as drafts for `ngram`.

Drafts are only proposals: outputs stay exactly the target's, whatever the cache holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specgen.errors import CheckpointError, UsageError

MAX_NGRAM, MIN_NGRAM = 4, 2  # n-gram lengths looked up, longest first
MIN_COUNT, MIN_SHARE = 2, 0.5  # an entry: seen at least this often, and this share of its n-gram's continuations
SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "text" / "ngram"  # <name>.safetensors


@dataclass(frozen=True)
class NgramCache:
    """n-gram (a tuple of MIN_NGRAM..MAX_NGRAM token ids) -> the token that most often followed it."""

    table: dict[tuple[int, ...], int] = field(repr=False)

    def next_token(self, seq: list[int]) -> int | None:
        """The cached continuation of seq's longest suffix that has one, else None."""
        for n in range(min(MAX_NGRAM, len(seq)), MIN_NGRAM - 1, -1):
            hit = self.table.get(tuple(seq[-n:]))
            if hit is not None:
                return hit
        return None

    def draft(self, seq: list[int], k: int) -> list[int]:
        """Up to k tokens, each the cached continuation of the sequence drafted so far."""
        out, drafted = list(seq[-MAX_NGRAM:]), []
        while len(drafted) < k:
            nxt = self.next_token(out)
            if nxt is None:
                break
            drafted.append(nxt)
            out.append(nxt)
        return drafted


def build_table(answers: list[list[int]]) -> dict[tuple[int, ...], int]:
    """The cache's table from token streams (see the module docstring for what is kept)."""
    follow: dict[tuple[int, ...], Counter] = {}
    for seq in answers:
        for n in range(MIN_NGRAM, MAX_NGRAM + 1):
            for i in range(len(seq) - n):
                follow.setdefault(tuple(seq[i : i + n]), Counter())[seq[i + n]] += 1
    table = {}
    for key, counts in follow.items():
        (token, count), total = counts.most_common(1)[0], sum(counts.values())
        if count >= MIN_COUNT and count >= MIN_SHARE * total:
            table[key] = token
    return table


def save(path: Path, answers: list[list[int]], tokenizer: str, how: str) -> None:
    """Write answers (token streams) as a cache file."""
    flat: list[int] = []
    for seq in answers:
        flat.extend(seq)
        flat.append(-1)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": torch.tensor(flat, dtype=torch.int32)}, str(path), {"tokenizer": tokenizer, "how": how})


def check_tokenizer(ref: str, tokenizer: str) -> None:
    """One line when the cache `ref` was made by another tokenizer than the target's (its header only: a refusal
    builds no table)."""
    path, made_by = read(ref, tokens=False)[:2]
    if tokenizer != made_by:
        raise UsageError(f"n-gram cache {path} was made with another tokenizer ({made_by}) than the target's "
                         f"({tokenizer}); build one for this model (python -m specgen.text.ngram_cache)")


def read(ref: str, tokens: bool = True) -> tuple[Path, str, list[int]]:
    """(path, tokenizer hash, the token streams joined by -1 when `tokens`) of a cache by shipped name
    (`specgen/assets/text/ngram/<name>.safetensors`) or file path; one line if neither, or if unreadable."""
    path = SHIPPED / f"{ref}.safetensors" if "/" not in ref and not ref.endswith(".safetensors") else Path(ref)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.safetensors"))) or "none"
        raise UsageError(f"no n-gram cache {ref!r}: give a shipped name ({shipped}) or a .safetensors file")
    try:
        with safe_open(str(path), "pt") as f:
            meta, flat = f.metadata() or {}, f.get_tensor("tokens").tolist() if tokens else []
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise CheckpointError(f"cannot read n-gram cache {path}: {e}") from None
    if "tokenizer" not in meta:
        raise CheckpointError(f"{path} is not an n-gram cache (no tokenizer in its metadata)")
    return path, meta["tokenizer"], flat


@lru_cache(maxsize=4)
def load(ref: str) -> NgramCache:
    """The cache `ref` (`read`) with its table built."""
    tokens = read(ref)[2]
    answers, cur = [], []
    for t in tokens:
        if t < 0:
            answers.append(cur)
            cur = []
        else:
            cur.append(t)
    return NgramCache(build_table(answers + [cur]))
