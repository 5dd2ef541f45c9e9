"""Bounding-box normalisation, n-bit vertex quantisation and face cleaning (BPT conventions)."""

from __future__ import annotations

import numpy as np

from specgen.mesh.errors import MeshInputError
from specgen.mesh.types import as_mesh, as_vertices

#: Half side of the normalised bounding box: the longest side spans [-0.95, 0.95] (BPT).
HALF_EXTENT = 0.95
#: BPT's ``normalize_vertices_scale`` divides by ``extent + 1e-6``; kept so bins match BPT's.
BPT_SCALE_EPS = 1e-6
#: Quantisation range: coordinates in (-1, 1), as BPT, MeshXL and MeshGPT.
COORD_RANGE = (-1.0, 1.0)


def normalize_bbox(vertices: np.ndarray, eps: float = BPT_SCALE_EPS) -> np.ndarray:
    """Vertices [V, 3] -> float64 [V, 3]: bounding box centred, longest side ``2 * HALF_EXTENT`` (docs/mesh.md)."""
    v = as_vertices(vertices)  # [V, 3]
    if len(v) == 0:
        raise MeshInputError("mesh has no vertices")
    lo, hi = v.min(axis=0), v.max(axis=0)  # [3], [3]
    extent = float((hi - lo).max())
    if extent <= 0.0:  # every point the same one: no shape to condition on or decode (BPT's eps would hide it)
        raise MeshInputError("mesh bounding box has zero size: every point is the same one")
    return (v - 0.5 * (lo + hi)) * (2.0 * HALF_EXTENT / (extent + eps))


def quantize(coords: np.ndarray, bits: int = 7) -> np.ndarray:
    """Floats [..., 3] in (-1, 1) -> int64 bins [..., 3] in [0, 2**bits), exactly as BPT's ``discretize``."""
    n = 1 << bits
    lo, hi = COORD_RANGE
    t = (np.asarray(coords, dtype=np.float64) - lo) / (hi - lo)
    t = t * n - 0.5  # same operation order as BPT, so boundary cases round the same way
    return np.clip(np.round(t), 0, n - 1).astype(np.int64)


def dequantize(bins: np.ndarray, bits: int = 7) -> np.ndarray:
    """Bin centres ``(q + 0.5) / n * 2 - 1`` (BPT ``undiscretize``, in float64, not float32)."""
    n = 1 << bits
    lo, hi = COORD_RANGE
    return (np.asarray(bins, dtype=np.float64) + 0.5) / n * (hi - lo) + lo


def merge_vertices(coords: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge identical integer vertices [V, 3] (lexicographic order): (unique [U, 3], remapped faces [F, 3])."""
    unique, inverse = np.unique(np.asarray(coords, dtype=np.int64).reshape(-1, 3), axis=0, return_inverse=True)
    remapped = inverse.reshape(-1)[np.asarray(faces, dtype=np.int64)]  # [F, 3]
    return unique, remapped.reshape(-1, 3)


def unique_rows_in_order(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows [U, C] of rows [N, C] by first appearance, and each row's index among them [N]."""
    unique, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    return unique[order], np.argsort(order)[inverse.reshape(-1)]  # argsort of a permutation: its inverse


def clean_faces(faces: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(kept faces, degenerate, duplicate): faces [F, 3] less the degenerate ones (a repeated index) and duplicates
    (same vertex set as an earlier face, either winding; the first one stays)."""
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    nondegenerate = (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])
    kept = f[nondegenerate]  # [K, 3]
    if len(kept) == 0:
        return kept, len(f), 0
    _, first = np.unique(np.sort(kept, axis=1), axis=0, return_index=True)
    unique = kept[np.sort(first)]
    return unique, int((~nondegenerate).sum()), int(len(kept) - len(unique))


def remove_unreferenced(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop vertices no face uses, keeping the order of the rest; faces are reindexed."""
    v = np.asarray(vertices)
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    used = np.zeros(len(v), dtype=bool)
    used[f.reshape(-1)] = True
    new_index = np.cumsum(used) - 1  # [V]
    return v[used], new_index[f]


def quantize_mesh(vertices: np.ndarray, faces: np.ndarray, bits: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """(int64 bins [V, 3] in [0, 2**bits), faces [F, 3] with the input winding) of vertices already in (-1, 1) (no
    normalisation): equal bins merged, faces cleaned, unused vertices dropped."""
    mesh = as_mesh(vertices, faces)
    coords, merged_faces = merge_vertices(quantize(mesh.vertices, bits), mesh.faces)
    return remove_unreferenced(coords, clean_faces(merged_faces)[0])
