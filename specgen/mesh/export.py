"""Clean and write meshes (obj, ply, stl, off, glb via trimesh) and PNG previews, atomically."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trimesh

from specgen.mesh.errors import MeshInputError
from specgen.mesh.pointcloud import face_areas_normals
from specgen.mesh.quantize import clean_faces, remove_unreferenced, unique_rows_in_order
from specgen.mesh.types import as_mesh
from specgen.paths import atomic_write_bytes


#: Output formats: each name is trimesh's ``file_type`` and the file suffix (ply, stl and glb are binary).
EXPORT_FORMATS = ("obj", "ply", "stl", "off", "glb")


@dataclass(frozen=True)
class CleanedMesh:
    """A mesh ready to write, with what cleaning removed."""

    vertices: np.ndarray  # [V, 3] float64
    faces: np.ndarray  # [F, 3] int64
    degenerate_removed: int  # repeated vertex (after merging equal coordinates) or zero area
    duplicate_removed: int  # same vertex set as an earlier face, either winding


def clean_mesh(vertices: np.ndarray, faces: np.ndarray) -> CleanedMesh:
    """Merge exactly equal vertices (first-appearance order), drop degenerate, duplicate and unused parts."""
    mesh = as_mesh(vertices, faces)
    v, index = unique_rows_in_order(mesh.vertices)
    f = index[mesh.faces]
    kept, degenerate, duplicate = clean_faces(f)
    flat = face_areas_normals(v, kept)[0] <= 0.0  # collinear corners with distinct indices
    return CleanedMesh(*remove_unreferenced(v, kept[~flat]), degenerate + int(flat.sum()), duplicate)


def format_name(name: str) -> str:
    """An export format's name as given (any case), or MeshInputError naming the known ones."""
    if name.lower() not in EXPORT_FORMATS:
        raise MeshInputError(f"unknown mesh format {name or '(none)'!r}; choose from {', '.join(EXPORT_FORMATS)}")
    return name.lower()


def export_mesh(vertices: np.ndarray, faces: np.ndarray, path: str | Path, fmt: str | None = None) -> Path:
    """Clean the mesh (``clean_mesh``) and write it atomically as ``fmt`` (default: suffix); MeshInputError for an
    unknown format or a mesh with no face left."""
    name = format_name(fmt or Path(path).suffix.lstrip("."))
    cleaned = clean_mesh(vertices, faces)
    if len(cleaned.faces) == 0:
        raise MeshInputError("nothing to export: no non-degenerate faces")
    data = trimesh.Trimesh(cleaned.vertices, cleaned.faces, process=False).export(file_type=name)
    return atomic_write_bytes(path, data.encode("utf-8") if isinstance(data, str) else bytes(data))


def render_png(vertices: np.ndarray, faces: np.ndarray, path: str | Path, *, size: int = 512) -> Path:
    """Shaded 3D preview with matplotlib's Agg canvas (no display needed), written atomically."""
    # deferred: start-up (matplotlib only for previews)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    mesh = as_mesh(vertices, faces)
    if len(mesh.faces) == 0:
        raise MeshInputError("nothing to render: mesh has no faces")
    tri = mesh.vertices[mesh.faces]  # [F, 3, 3]
    _, normals = face_areas_normals(mesh.vertices, mesh.faces)  # [F, 3]
    light = np.array([0.4, -0.5, 0.8]) / np.linalg.norm([0.4, -0.5, 0.8])
    shade = 0.35 + 0.65 * np.abs(normals @ light)  # [F], two-sided
    colors = np.clip(shade[:, None] * np.array([0.47, 0.6, 0.75]), 0.0, 1.0)  # [F, 3]

    dpi = 100
    fig = Figure(figsize=(size / dpi, size / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0), projection="3d")
    ax.add_collection3d(
        Poly3DCollection(tri, facecolors=colors, edgecolors=(0, 0, 0, 0.25), linewidths=0.3)
    )
    lo, hi = mesh.vertices.min(axis=0), mesh.vertices.max(axis=0)
    centre, half = 0.5 * (lo + hi), 0.5 * float((hi - lo).max() or 1.0)
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_zlim(centre[2] - half, centre[2] + half)
    ax.set_box_aspect((1, 1, 1), zoom=1.25)
    ax.view_init(elev=25.0, azim=-60.0)
    ax.set_axis_off()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return atomic_write_bytes(path, buf.getvalue())
