"""Procedural dataset: determinism, face bound, splits, and reading user mesh folders."""

import dataclasses
import hashlib
import itertools

import numpy as np
import pytest
import trimesh

from specgen.mesh.errors import MeshInputError
from specgen.mesh.procedural import (
    MAX_FACES,
    SPLITS,
    ProceduralSpec,
    generate_mesh,
    load_mesh,
    split_seeds,
)
from specgen.mesh.quantize import quantize


def test_same_seed_same_mesh_and_different_seeds_differ():
    a, b, c = generate_mesh(123), generate_mesh(123), generate_mesh(124)
    assert np.array_equal(a.vertices, b.vertices) and np.array_equal(a.faces, b.faces)
    assert a.parts == b.parts
    assert not (a.vertices.shape == c.vertices.shape and np.array_equal(a.vertices, c.vertices))


def test_meshes_are_small_quantised_and_clean():
    for m in map(generate_mesh, split_seeds("validation", 60)):
        assert 0 < len(m.faces) <= MAX_FACES < 800
        assert 1 <= len(m.parts) <= 4
        assert np.abs(m.vertices).max() <= 0.95 + 1 / 128
        bins = quantize(m.vertices)
        assert len(np.unique(bins, axis=0)) == len(bins)  # merged
        f = m.faces
        assert ((f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])).all()
        assert len(np.unique(np.sort(f, axis=1), axis=0)) == len(f)
        assert np.array_equal(np.unique(f), np.arange(len(m.vertices)))  # no unused vertex


def test_splits_are_disjoint_seed_ranges():
    ranges = sorted(SPLITS.values(), key=lambda r: r.start)
    assert all(a.stop <= b.start for a, b in itertools.pairwise(ranges))
    assert list(split_seeds("test", 3)) == [SPLITS["test"].start + i for i in range(3)]
    assert list(split_seeds("validation", 2, start=5)) == [1_000_005, 1_000_006]
    with pytest.raises(MeshInputError, match="unknown split"):
        split_seeds("dev")


def test_load_errors_are_mesh_input_errors(tmp_path):
    (tmp_path / "bad.stl").write_bytes(b"\x00garbage")
    with pytest.raises(MeshInputError, match="bad.stl"):
        load_mesh(tmp_path / "bad.stl")
    with pytest.raises(MeshInputError, match="unsupported"):
        load_mesh(tmp_path / "x.fbx")


def test_axis_aligned_single_part_spec():
    spec = ProceduralSpec(max_parts=1, rotation="axis")
    assert ProceduralSpec.from_meta({"procedural": dataclasses.asdict(spec)}) == spec
    assert ProceduralSpec.from_meta({}) == ProceduralSpec()  # checkpoints without the key: the full distribution
    meshes = [generate_mesh(s, spec) for s in range(40)]
    assert all(len(m.parts) == 1 for m in meshes)
    boxes = [m for m in meshes if m.parts == ("box",)]
    assert boxes
    for m in boxes:  # an axis-aligned box keeps two coordinate values per axis
        assert [len(np.unique(m.vertices[:, a])) for a in range(3)] == [2, 2, 2]
    # the default spec is the full distribution, unchanged: digest of meshes made before ProceduralSpec existed
    h = hashlib.sha256()
    for s in (0, 7, 1_010_000, 1_010_003):
        m = generate_mesh(s, ProceduralSpec())
        h.update(m.vertices.tobytes())
        h.update(m.faces.tobytes())
    assert h.hexdigest()[:16] == "1618843c8a35018d"
    with pytest.raises(MeshInputError, match="max_parts"):
        ProceduralSpec(max_parts=0)
    with pytest.raises(MeshInputError, match="rotation"):
        ProceduralSpec(rotation="random")
