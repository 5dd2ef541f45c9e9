"""Naive PolyGen/MeshGPT-style baseline the tests compare BPT with: 9 coordinate tokens per face (docs/mesh.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.tokenizers import (DecodedMesh, StrictDecode, as_token_array, canonical_mesh, cut_at_eos,
                                     triangles_to_mesh)

TOKENS_PER_FACE = 9
ZYX = [2, 1, 0]  # per-vertex token order: z, y, x


@dataclass(frozen=True)
class NaiveTokenizer(StrictDecode):
    """Nine tokens per face; see the module docstring."""

    bits: int = 7
    name: ClassVar[str] = "naive"

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 16:
            raise MeshInputError("bits must be in [1, 16]")

    @property
    def bos_id(self) -> int:
        return 1 << self.bits

    @property
    def eos_id(self) -> int:
        return (1 << self.bits) + 1

    @property
    def pad_id(self) -> int:
        return (1 << self.bits) + 2

    @property
    def vocab_size(self) -> int:
        return (1 << self.bits) + 3

    def encode(
        self, vertices: np.ndarray, faces: np.ndarray, *, add_eos: bool = True
    ) -> np.ndarray:
        """Mesh with coordinates in [-1, 1] -> int64 tokens [9F (+1)]."""
        coords, f = canonical_mesh(vertices, faces, self.bits, lambda c: np.lexsort((c[:, 0], c[:, 1], c[:, 2])))
        tokens = coords[f][:, :, ZYX].reshape(-1)  # [F, 3, 3] -> [9F]
        if add_eos:
            tokens = np.append(tokens, self.eos_id)
        return tokens.astype(np.int64)

    def decode_partial(self, tokens: object) -> DecodedMesh:
        """Tolerant decode: every complete, well-formed face, plus the errors met."""
        seq = as_token_array(tokens)
        start = 1 if len(seq) and seq[0] == self.bos_id else 0
        body = cut_at_eos(seq[start:], self.eos_id)
        errors: list[MeshDecodeError] = []
        if len(body) == 0:
            errors.append(MeshDecodeError(start, "empty token sequence"))
        n_full = len(body) // TOKENS_PER_FACE
        if len(body) % TOKENS_PER_FACE:
            pos = start + n_full * TOKENS_PER_FACE
            have = len(body) % TOKENS_PER_FACE
            errors.append(MeshDecodeError(pos, f"incomplete face: {have} of 9 tokens"))
        groups = body[: n_full * TOKENS_PER_FACE].reshape(-1, TOKENS_PER_FACE)  # [F, 9]
        bad = (groups < 0) | (groups >= 1 << self.bits)  # [F, 9]
        for fi, k in zip(*np.nonzero(bad)):
            pos = start + fi * TOKENS_PER_FACE + k
            errors.append(MeshDecodeError(pos, f"token id {groups[fi, k]} is not a coordinate"))
        good = groups[~bad.any(axis=1)].reshape(-1, 3, 3)[:, :, ZYX]  # back to x, y, z
        vertices, faces = triangles_to_mesh(good, self.bits)
        errors.sort(key=lambda e: e.position)
        return DecodedMesh(vertices=vertices, faces=faces, errors=tuple(errors))
