"""Seeded surface sampling and point-cloud validation errors."""

import numpy as np
import pytest
import trimesh

from specgen.mesh.errors import MeshInputError
from specgen.mesh.pointcloud import sample_surface, validate_point_cloud

BOX = trimesh.creation.box()


def test_samples_lie_on_the_surface_with_unit_face_normals():
    points, normals, face_index = sample_surface(BOX.vertices, BOX.faces, 500, seed=3)
    assert points.shape == normals.shape == (500, 3)
    on_face = np.isclose(np.abs(points).max(axis=1), 0.5)  # every point on some box side
    assert on_face.all()
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0)
    np.testing.assert_allclose(normals, BOX.face_normals[face_index])


def test_sampling_is_seeded_and_area_weighted():
    a = sample_surface(BOX.vertices, BOX.faces, 64, seed=1)[0]
    b = sample_surface(BOX.vertices, BOX.faces, 64, seed=1)[0]
    c = sample_surface(BOX.vertices, BOX.faces, 64, seed=2)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # a big and a tiny triangle: samples land in proportion to area
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [5, 5, 0], [5.01, 5, 0], [5, 5.01, 0]], float)
    face_index = sample_surface(v, np.array([[0, 1, 2], [3, 4, 5]]), 4000, seed=0)[2]
    assert (face_index == 1).sum() < 10


def test_sampling_a_mesh_without_area_fails_clearly():
    with pytest.raises(MeshInputError, match="no surface area"):
        sample_surface(np.zeros((3, 3)), np.array([[0, 1, 2]]), 10)


@pytest.mark.parametrize(
    "points, match",
    [
        (np.zeros((5, 4)), r"shape \[N, 6\] \(points and normals\), got \[5, 4\]"),
        (np.zeros(3), r"got \[3\]"),
        (np.zeros((2, 3)), r"got \[2, 3\]"),
        (np.zeros((0, 6)), "0 points"),
        (np.array([[0.0, np.nan, 0.0, 0, 0, 1]]), "NaN"),
        (np.array([[0.0, 0, 0, 0, 0, 1], [0, 0, 0, np.inf, 0, 0]]), "NaN or infinite"),
        (np.array([[0.0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]]), "1 normals have zero length"),
        ([["a", "b", "c"]], "not a numeric array"),
    ],
)
def test_validation_errors(points, match):
    with pytest.raises(MeshInputError, match=match) as info:
        validate_point_cloud(points)
    assert isinstance(info.value, ValueError)


def test_validation_accepts_points_and_normals_and_normalises():
    arr = np.concatenate(
        [np.random.default_rng(0).normal(size=(8, 3)), np.tile([0, 0, 2.0], (8, 1))], axis=1
    )
    np.testing.assert_allclose(validate_point_cloud(arr)[1], np.tile([0, 0, 1.0], (8, 1)))
    with pytest.raises(MeshInputError, match="at least 16"):
        validate_point_cloud(arr, min_points=16)
