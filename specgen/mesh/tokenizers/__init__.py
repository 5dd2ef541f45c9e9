"""Mesh tokenizers by name: BPT's blocked-and-patchified scheme and the naive 9-per-face baseline."""

from __future__ import annotations

from specgen.mesh.tokenizers.bpt import BPTTokenizer
from specgen.mesh.tokenizers.naive import NaiveTokenizer

TOKENIZERS: dict[str, type] = {"bpt": BPTTokenizer, "naive": NaiveTokenizer}

__all__ = ["TOKENIZERS", "BPTTokenizer", "NaiveTokenizer"]
