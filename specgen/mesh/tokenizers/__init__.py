"""Mesh tokenizers: BPT's blocked-and-patchified scheme (the naive 9-per-face baseline is test support)."""

from __future__ import annotations

from specgen.mesh.tokenizers.bpt import BPTTokenizer

__all__ = ["BPTTokenizer"]
