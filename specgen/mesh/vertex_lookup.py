"""Vertex lookup (beyond XSpecMesh): a BPT block token seen earlier in the mesh proposes the offset that followed it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specgen.mesh.tokenizers import BPTTokenizer as BPT


@dataclass
class VertexMemory:
    """Latest offset emitted right after each block id in one mesh's token sequence so far."""

    offsets: dict[int, int] = field(default_factory=dict)  # block id -> offset token
    read_upto: int = 0  # tokens of the sequence already read

    def block_id(self, token: int) -> int | None:
        """Block id of a plain or special block token; None for offsets, EOS and anything else."""
        if 0 <= token < BPT.offset_base:
            return token
        if BPT.special_base <= token < BPT.eos_id:
            return token - BPT.special_base
        return None

    def is_offset(self, token: int) -> bool:
        return BPT.offset_base <= token < BPT.special_base

    def read(self, seq: list[int]) -> None:
        """Learn the block -> offset pairs of seq, which extends every sequence read before (decoding appends)."""
        for p in range(max(self.read_upto - 1, 0), len(seq) - 1):
            b = self.block_id(seq[p])
            if b is not None and self.is_offset(seq[p + 1]):
                self.offsets[b] = seq[p + 1]
        self.read_upto = len(seq)

    def knows(self, prev: int) -> bool:
        """Is `prev` a block this mesh already followed by an offset (so the token after it comes from memory)?"""
        return self.block_id(prev) in self.offsets

    def after(self, prev: int) -> int | None:
        """The offset remembered after block token `prev`; None where `prev` is no known block."""
        return self.offsets.get(self.block_id(prev))

    def propose(self, last: int, heads: Callable[[], list[int]], d: int) -> list[int]:
        """D candidates after token `last`: the remembered offset after a known block, else `heads()`'s (lazily)."""
        out: list[int] = []
        for j in range(d):
            known = self.after(out[-1] if out else last)
            out.append(heads()[j] if known is None else known)
        return out

    def known_rows(self, seq: list[int]) -> list[int]:
        """For each position t of seq, the first row i whose memory (having read seq[: i + 1]) proposes the token
        at t, i.e. knows an offset for the block seq[t - 1]; len(seq) where it never does. Training uses it to
        skip the targets a head would never be asked for (`train/heads.py`, `skip_known_offsets`)."""
        first_end: dict[int, int] = {}  # block id -> index of the offset that completed its first pair
        out = [len(seq)] * len(seq)
        for t in range(1, len(seq)):
            b = self.block_id(seq[t - 1])
            if b is not None and b in first_end:
                out[t] = first_end[b]
            if b is not None and self.is_offset(seq[t]):
                first_end.setdefault(b, t)
        return out
