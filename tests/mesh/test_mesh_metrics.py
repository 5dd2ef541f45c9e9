"""CD/HD under BPT's definition on hand-computable pairs, and the mesh check."""

import numpy as np
import pytest
import trimesh

from specgen.mesh.metrics import (
    NUM_SAMPLES,
    mesh_distances,
    normalized_samples,
    point_distances,
)

SQUARE_V = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], float)
SQUARE_F = np.array([[0, 1, 2], [0, 2, 3]])


def test_parallel_squares_point_sets():
    # the same (x, y) samples on two parallel unit squares d apart: every NN distance is d
    xy = np.random.default_rng(0).random((NUM_SAMPLES, 2))
    d = 0.3
    a = np.column_stack([xy, np.zeros(NUM_SAMPLES)])
    b = np.column_stack([xy, np.full(NUM_SAMPLES, d)])
    assert point_distances(a, b).chamfer == pytest.approx(2 * d)  # sum of the two directed means
    assert point_distances(a, b).hausdorff == pytest.approx(d)


def test_chamfer_is_asymmetric_per_side_hand_computed():
    a = np.array([[0.0, 0, 0], [1, 0, 0]])
    b = np.array([[0.0, 0, 0]])
    # a->b: 0 and 1 (mean 0.5); b->a: 0 (mean 0): CD = 0.5, HD = 1
    assert point_distances(a, b).chamfer == pytest.approx(0.5)
    assert point_distances(a, b).hausdorff == pytest.approx(1.0)


def test_identical_and_similar_meshes_score_zero():
    box = trimesh.creation.box()
    d = mesh_distances(box.vertices, box.faces, box.vertices, box.faces)
    assert (d.chamfer, d.hausdorff) == (0.0, 0.0)
    # each mesh is normalised on its own, so a moved and scaled copy also scores 0
    moved = box.vertices * 3.0 + [5.0, -2.0, 1.0]
    d = mesh_distances(moved, box.faces, box.vertices, box.faces)
    assert d.chamfer == pytest.approx(0.0, abs=1e-12)


def test_two_sheets_against_one_sheet():
    # A: unit squares at z=0 and z=0.5; after normalisation (longest side 1 -> 1.9) they sit at
    # z = +-0.475. B: one unit square, normalised to z = 0. Every NN distance is at least 0.475
    # (plus a small in-plane part), so CD is just above 2 * 0.475 and HD just above 0.475.
    top = SQUARE_V + [0, 0, 0.5]
    a_v, a_f = np.vstack([SQUARE_V, top]), np.vstack([SQUARE_F, SQUARE_F + 4])
    d = mesh_distances(a_v, a_f, SQUARE_V, SQUARE_F)
    assert 0.95 <= d.chamfer < 0.97
    assert 0.475 <= d.hausdorff < 0.52


def test_normalized_samples_fill_the_bpt_box_and_ignore_unused_vertices():
    v = np.vstack([SQUARE_V, [[50.0, 50.0, 50.0]]])  # an unused far vertex
    pts = normalized_samples(v, SQUARE_F, 2000, seed=0)
    assert pts.shape == (2000, 3)
    assert np.abs(pts[:, :2]).max() <= 0.95 and np.abs(pts[:, :2]).max() > 0.9


def test_benchmark_reference_distances():
    import trimesh

    from specgen.eval.mesh_bench import reference_distances

    box, ball = trimesh.creation.box(extents=[2, 2, 2]), trimesh.creation.icosphere(2)
    same = reference_distances([box, box])
    assert same == {"cd_box": 0.0, "cd_other_mesh": 0.0}  # a cube of any size: each mesh normalised on its own
    mixed = reference_distances([box, ball])
    assert mixed["cd_box"] > 0 and mixed["cd_other_mesh"] > 0
    assert reference_distances([box])["cd_other_mesh"] is None
