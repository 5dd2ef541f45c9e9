"""Frozen, validated triangle-mesh arrays passed between the mesh stages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgen.mesh.errors import MeshInputError


@dataclass(frozen=True)
class MeshArrays:
    """A triangle mesh (read-only copies): vertices [V, 3] float64, faces [F, 3] int64 indexing [0, V)."""

    vertices: np.ndarray  # [V, 3] float64
    faces: np.ndarray  # [F, 3] int64


def as_vertices(vertices: object, *, name: str = "mesh") -> np.ndarray:
    """Validated float64 copy of a finite [V, 3] vertex array; MeshInputError otherwise."""
    try:
        v = np.array(vertices, dtype=np.float64)  # [V, 3]
    except (TypeError, ValueError) as exc:
        raise MeshInputError(f"{name}: vertices are not numeric ({exc})") from None
    if v.ndim != 2 or v.shape[1] != 3:
        raise MeshInputError(f"{name}: vertices must have shape [V, 3], got {list(v.shape)}")
    if not np.isfinite(v).all():
        raise MeshInputError(f"{name}: vertices contain NaN or infinite values")
    return v


def as_mesh(vertices: object, faces: object, *, name: str = "mesh") -> MeshArrays:
    """Read-only ``MeshArrays``; MeshInputError naming ``name`` unless finite vertices [V, 3] and integer faces [F, 3]
    (possibly none) index in range."""
    v = as_vertices(vertices, name=name)
    f = np.asarray(faces)
    if f.size == 0:
        f = np.zeros((0, 3), dtype=np.int64)
    if f.ndim != 2 or f.shape[1] != 3:
        raise MeshInputError(
            f"{name}: faces must have shape [F, 3] (triangles), got {list(f.shape)}"
        )
    whole_floats = np.issubdtype(f.dtype, np.floating) and bool(np.all(np.mod(f, 1) == 0))
    if not (np.issubdtype(f.dtype, np.integer) or whole_floats):
        raise MeshInputError(f"{name}: face indices must be integers")
    f = f.astype(np.int64)  # [F, 3]
    if f.size and (f.min() < 0 or f.max() >= len(v)):
        raise MeshInputError(
            f"{name}: face index out of range [0, {len(v)}): min {f.min()}, max {f.max()}"
        )
    v.setflags(write=False)
    f.setflags(write=False)
    return MeshArrays(vertices=v, faces=f)
