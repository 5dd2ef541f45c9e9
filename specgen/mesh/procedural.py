"""Deterministic procedural low-poly meshes from trimesh primitives (one seed, one mesh), and user meshes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trimesh

from specgen.mesh.errors import MeshInputError
from specgen.mesh.quantize import dequantize, normalize_bbox, quantize_mesh
from specgen.mesh.types import MeshArrays, as_mesh

MAX_FACES = 799  # strictly fewer than 800 faces
MAX_PARTS = 4
BITS = 7
SPLITS: dict[str, range] = {
    "train": range(1_000_000),
    "validation": range(1_000_000, 1_010_000),
    "test": range(1_010_000, 1_020_000),
}
MESH_SUFFIXES = (".obj", ".ply", ".stl", ".off", ".glb")

_c = trimesh.creation


def _n(rng: np.random.Generator, lo: int, hi: int) -> int:
    """Integer in [lo, hi] inclusive."""
    return int(rng.integers(lo, hi + 1))


#: name -> builder(rng) of a watertight primitive of about unit size (face counts in comments).
PRIMITIVES: dict[str, Callable[[np.random.Generator], trimesh.Trimesh]] = {
    "box": lambda rng: _c.box(extents=[1.0, 1.0, 1.0]),  # 12
    "icosphere": lambda rng: _c.icosphere(subdivisions=_n(rng, 0, 2), radius=0.5),  # 20-320
    "uv_sphere": lambda rng: _c.uv_sphere(radius=0.5, count=[_n(rng, 4, 8), _n(rng, 4, 8)]),
    "cylinder": lambda rng: _c.cylinder(radius=0.5, height=1.0, sections=_n(rng, 3, 16)),  # 12-64
    "cone": lambda rng: _c.cone(radius=0.5, height=1.0, sections=_n(rng, 3, 16)),  # 6-32
    "capsule": lambda rng: _c.capsule(height=0.5, radius=0.3, count=[_n(rng, 4, 8), _n(rng, 4, 8)]),
    "annulus": lambda rng: _c.annulus(r_min=0.25, r_max=0.5, height=0.5, sections=_n(rng, 4, 12)),
    "torus": lambda rng: _c.torus(
        major_radius=0.35,
        minor_radius=0.12,
        major_sections=_n(rng, 5, 10),
        minor_sections=_n(rng, 3, 6),
    ),
}


@dataclass(frozen=True)
class ProceduralMesh:
    """One generated mesh: vertices [V, 3] float64 in [-0.95, 0.95], faces [F, 3] int64."""

    vertices: np.ndarray  # [V, 3] float64 (7-bit bin centres)
    faces: np.ndarray  # [F, 3] int64, F < 800
    parts: tuple[str, ...]  # primitive names, in order


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """Uniformly random rotation matrix [3, 3] (Shoemake's quaternion method)."""
    u1, u2, u3 = rng.random(3)
    a, b = np.sqrt(1.0 - u1), np.sqrt(u1)
    x, y = a * np.sin(2 * np.pi * u2), a * np.cos(2 * np.pi * u2)
    z, w = b * np.sin(2 * np.pi * u3), b * np.cos(2 * np.pi * u3)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


# The 24 rotations [3, 3] that map the coordinate axes onto themselves: signed permutations of determinant +1 (in
# this order: a seed's mesh depends on it).
AXIS_ROTATIONS = [m for perm in ((0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 2, 1), (2, 1, 0), (1, 0, 2))
                  for m in (np.diag([1 - 2 * x for x in s]) @ np.eye(3)[list(perm)] for s in np.ndindex(2, 2, 2))
                  if np.linalg.det(m) > 0]
ROTATIONS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {  # "axis": one of AXIS_ROTATIONS, uniformly
    "uniform": random_rotation, "axis": lambda rng: AXIS_ROTATIONS[int(rng.integers(len(AXIS_ROTATIONS)))]}


@dataclass(frozen=True)
class ProceduralSpec:
    """Which procedural distribution: parts per mesh and the rotation law; a backbone records its own (`procedural`)."""

    max_parts: int = MAX_PARTS  # 1 .. MAX_PARTS parts, uniformly
    rotation: str = "uniform"  # "uniform" (Shoemake) | "axis" (one of the 24 axis-aligned rotations)

    def __post_init__(self) -> None:
        if not 1 <= self.max_parts <= MAX_PARTS or self.rotation not in ROTATIONS:
            raise MeshInputError(f"procedural spec needs 1 <= max_parts <= {MAX_PARTS} and rotation in "
                                 f"{', '.join(ROTATIONS)}; got {self.max_parts}, {self.rotation!r}")

    @classmethod
    def from_meta(cls, meta: dict) -> "ProceduralSpec":
        """The spec a checkpoint's config.json records (`asdict`; the default for checkpoints that predate it)."""
        return cls(**meta.get("procedural", {}))


def generate_mesh(seed: int, spec: ProceduralSpec | None = None) -> ProceduralMesh:
    """The procedural mesh for ``seed`` under ``spec`` (see the module docstring for the recipe)."""
    spec = spec or ProceduralSpec()
    rng = np.random.default_rng(int(seed))
    names = list(PRIMITIVES)
    vertices, faces, parts = [], [], []
    total_v = total_f = 0
    for _ in range(_n(rng, 1, spec.max_parts)):
        name = names[int(rng.integers(len(names)))]
        part = PRIMITIVES[name](rng)
        scale = rng.uniform(0.6, 1.4, size=3)  # [3]
        rot, shift = ROTATIONS[spec.rotation](rng), rng.uniform(-0.5, 0.5, size=3)
        if total_f + len(part.faces) > MAX_FACES:
            continue
        vertices.append((np.asarray(part.vertices) * scale) @ rot.T + shift)  # [v, 3]
        faces.append(np.asarray(part.faces, dtype=np.int64) + total_v)
        parts.append(name)
        total_v, total_f = total_v + len(part.vertices), total_f + len(part.faces)
    coords, faces = quantize_mesh(normalize_bbox(np.concatenate(vertices)), np.concatenate(faces), BITS)
    return ProceduralMesh(vertices=dequantize(coords, BITS), faces=faces, parts=tuple(parts))


def split_seeds(split: str, count: int | None = None, start: int = 0) -> range:
    """Seeds ``start .. start+count-1`` of a split (all of it when ``count`` is None)."""
    if split not in SPLITS:
        raise MeshInputError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    seeds = SPLITS[split][start:]
    if count is not None:
        if count > len(seeds):
            raise MeshInputError(f"split {split!r} has only {len(seeds)} seeds from {start}")
        seeds = seeds[:count]
    return seeds


def load_mesh(path: str | Path) -> MeshArrays:
    """Read one obj/ply/stl/off/glb file as a single triangle mesh (scenes are concatenated)."""
    p = Path(path)
    if p.suffix.lower() not in MESH_SUFFIXES:
        raise MeshInputError(f"{p}: unsupported mesh format; use one of {', '.join(MESH_SUFFIXES)}")
    if not p.is_file():
        raise MeshInputError(f"{p}: no such file")
    try:
        mesh = trimesh.load(p, force="mesh", process=False)
    except Exception as exc:  # noqa: BLE001 - trimesh raises many types for corrupt files
        raise MeshInputError(f"{p}: cannot read mesh ({type(exc).__name__}: {exc})") from None
    faces = np.asarray(getattr(mesh, "faces", np.zeros((0, 3))), dtype=np.int64).reshape(-1, 3)
    if len(faces) == 0:
        raise MeshInputError(f"{p}: file holds no triangle faces")
    return as_mesh(mesh.vertices, faces, name=str(p))
