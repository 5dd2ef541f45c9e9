"""Shared pieces of the mesh tokenizers: the decode result and sequence helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.quantize import dequantize, quantize_mesh, unique_rows_in_order
from specgen.mesh.types import as_mesh


@dataclass(frozen=True)
class DecodedMesh:
    """What a tolerant decode recovered (equal bins merged, first-appearance order) and every problem it skipped."""

    vertices: np.ndarray  # [V, 3] float64
    faces: np.ndarray  # [F, 3] int64
    errors: tuple[MeshDecodeError, ...]  # by position; empty when the sequence is well formed


def canonical_mesh(vertices: object, faces: object, bits: int, order: Callable[[np.ndarray], np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A mesh in [-1, 1] quantised for encoding (BPT would clip outside it; we refuse) in a tokenizer's canonical
    order: vertices sorted by `order` (integer coords [V, 3] -> permutation [V]), each face rotated so its lowest index
    comes first (winding kept), faces stably sorted by their ascending index tuple (PolyGen/BPT face order)."""
    mesh = as_mesh(vertices, faces)
    if len(mesh.vertices) and np.abs(mesh.vertices).max() > 1.0:
        raise MeshInputError("coordinates must lie in [-1, 1]; normalise the mesh with normalize_bbox first")
    coords, faces = quantize_mesh(mesh.vertices, mesh.faces, bits)
    if len(faces) == 0:
        raise MeshInputError("mesh has no non-degenerate faces after quantisation")
    perm = order(coords)
    rank = np.empty(len(perm), dtype=np.int64)  # new vertex i is old vertex perm[i]
    rank[perm] = np.arange(len(perm))
    f = rank[faces]  # [F, 3]
    f = np.take_along_axis(f, (np.argmin(f, axis=1)[:, None] + np.arange(3)[None, :]) % 3, axis=1)
    s = np.sort(f, axis=1)  # [F, 3]
    return coords[perm], f[np.lexsort((s[:, 2], s[:, 1], s[:, 0]))]  # lexsort is stable


def as_token_array(tokens: object) -> np.ndarray:
    """Tokens as a 1-D int64 array; MeshInputError for other shapes or non-integer values."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise MeshInputError(f"tokens must be a 1-D sequence, got shape {list(arr.shape)}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise MeshInputError(f"tokens must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def cut_at_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Tokens before the first EOS (everything from EOS on is ignored)."""
    hits = np.flatnonzero(tokens == eos_id)
    return tokens[: hits[0]] if len(hits) else tokens


def triangles_to_mesh(corners: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer triangle corners [T, 3, 3] -> (merged bin-centre vertices [V, 3] by first appearance, faces [T, 3])."""
    flat = np.asarray(corners, dtype=np.int64).reshape(-1, 3)  # [3T, 3]
    if len(flat) == 0:
        return np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64)
    unique, index = unique_rows_in_order(flat)
    return dequantize(unique, bits), index.reshape(-1, 3)


class StrictDecode:
    """`decode` from a tokenizer's tolerant `decode_partial`."""

    def decode(self, tokens: object) -> tuple[np.ndarray, np.ndarray]:
        """Strict decode -> (vertices [V, 3] float64, faces [F, 3] int64); raises the earliest MeshDecodeError."""
        decoded = self.decode_partial(tokens)
        if decoded.errors:
            raise decoded.errors[0]
        return decoded.vertices, decoded.faces
