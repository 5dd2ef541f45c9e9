"""Seeded area-weighted surface sampling (points + face normals) and point-cloud validation."""

from __future__ import annotations

import numpy as np

from specgen.mesh.errors import MeshInputError
from specgen.mesh.types import as_mesh


def face_areas_normals(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Triangle areas [F] and unit normals [F, 3] (zero for zero-area faces)."""
    tri = vertices[faces]  # [F, 3, 3]
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])  # [F, 3]
    norm = np.linalg.norm(cross, axis=1)  # [F]
    normals = np.divide(cross, norm[:, None], out=np.zeros_like(cross), where=norm[:, None] > 0)
    return 0.5 * norm, normals


def sample_surface(
    vertices: np.ndarray, faces: np.ndarray, count: int, seed: int | np.random.Generator = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` seeded points uniform on the surface: (points [N, 3] float64, their faces' unit normals [N, 3], face
    index [N]); MeshInputError without area."""
    mesh = as_mesh(vertices, faces)
    if count < 1:
        raise MeshInputError(f"sample count must be positive, got {count}")
    areas, normals = face_areas_normals(mesh.vertices, mesh.faces)
    total = float(areas.sum()) if len(areas) else 0.0
    if not total > 0.0:
        raise MeshInputError("mesh has no surface area to sample")
    rng = np.random.default_rng(seed)
    face_index = rng.choice(len(areas), size=count, p=areas / total)  # [N]
    u, v = rng.random((2, count))  # [N] each
    flip = u + v > 1.0  # reflect into the triangle
    u, v = np.where(flip, 1.0 - u, u), np.where(flip, 1.0 - v, v)
    tri = mesh.vertices[mesh.faces[face_index]]  # [N, 3, 3]
    points = tri[:, 0] + u[:, None] * (tri[:, 1] - tri[:, 0]) + v[:, None] * (tri[:, 2] - tri[:, 0])
    return points, normals[face_index], face_index


def validate_point_cloud(points: object, *, min_points: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Points and normals [N, 6] as (points [N, 3] float64, unit normals [N, 3]); MeshInputError for a wrong shape,
    fewer than ``min_points`` points, NaN/inf or zero-length normals."""
    try:
        a = np.array(points, dtype=np.float64)
    except (TypeError, ValueError):
        raise MeshInputError("point cloud is not a numeric array") from None
    if a.ndim != 2 or a.shape[1] != 6:
        raise MeshInputError(f"point cloud must have shape [N, 6] (points and normals), got {list(a.shape)}")
    if len(a) < min_points:
        raise MeshInputError(f"point cloud has {len(a)} points; at least {min_points} needed")
    if not np.isfinite(a).all():
        raise MeshInputError("point cloud contains NaN or infinite values")
    length = np.linalg.norm(a[:, 3:], axis=1)  # [N]
    if (length <= 1e-12).any():
        raise MeshInputError(f"{int((length <= 1e-12).sum())} normals have zero length")
    return a[:, :3], a[:, 3:] / length[:, None]


def point_cloud(vertices: np.ndarray, faces: np.ndarray, num_points: int, seed) -> np.ndarray:
    """Condition input [num_points, 6] float32: surface points + face normals (BPT's ``pc_normal`` layout)."""
    return np.concatenate(sample_surface(vertices, faces, num_points, seed)[:2], axis=1).astype(np.float32)
