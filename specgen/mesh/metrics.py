"""Chamfer and Hausdorff distances exactly as BPT's ``metrics.py`` defines them (docs/mesh.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from specgen.mesh.pointcloud import sample_surface
from specgen.mesh.quantize import normalize_bbox, remove_unreferenced
from specgen.mesh.types import as_mesh

NUM_SAMPLES = 1024


@dataclass(frozen=True)
class MeshDistances:
    """CD and HD between a generated and a reference mesh (BPT's convention)."""

    chamfer: float
    hausdorff: float


def point_distances(a: np.ndarray, b: np.ndarray) -> MeshDistances:
    """CD and HD of point sets [N, 3] and [M, 3] (L2, not squared): CD the sum of the two directed mean nearest-point
    distances, HD the larger of the two directed maxima."""
    ab, ba = cKDTree(b).query(a, k=1)[0], cKDTree(a).query(b, k=1)[0]  # [N], [M]
    return MeshDistances(chamfer=float(ab.mean() + ba.mean()), hausdorff=float(max(ab.max(), ba.max())))


def normalized_samples(
    vertices: np.ndarray, faces: np.ndarray, samples: int = NUM_SAMPLES, seed: int = 0
) -> np.ndarray:
    """BPT evaluation samples [N, 3] of one mesh normalised to [-0.95, 0.95] (the box of face-used vertices, as BPT)."""
    mesh = as_mesh(vertices, faces)  # no faces: no vertex left to normalise (MeshInputError)
    v, f = remove_unreferenced(mesh.vertices, mesh.faces)
    return sample_surface(normalize_bbox(v, eps=0.0), f, samples, seed)[0]


def mesh_distances(gen_vertices: np.ndarray, gen_faces: np.ndarray, ref_vertices: np.ndarray, ref_faces: np.ndarray
                   ) -> MeshDistances:
    """CD and HD between a generated and a reference mesh under BPT's protocol (module doc)."""
    return point_distances(normalized_samples(gen_vertices, gen_faces), normalized_samples(ref_vertices, ref_faces))
