"""Normalisation, quantisation, vertex merging and face cleaning."""

import numpy as np
import pytest

from specgen.mesh.errors import MeshInputError
from specgen.mesh.quantize import (
    clean_faces,
    dequantize,
    merge_vertices,
    normalize_bbox,
    quantize,
    quantize_mesh,
    remove_unreferenced,
)


def test_normalize_bbox_centres_and_scales_longest_side_to_1_9():
    v = np.array([[0.0, 0.0, 0.0], [2.0, 1.0, 0.0], [1.0, 0.0, 0.5]])
    out = normalize_bbox(v, eps=0.0)
    np.testing.assert_allclose(out.min(axis=0), [-0.95, -0.475, -0.2375])
    np.testing.assert_allclose(out.max(axis=0), [0.95, 0.475, 0.2375])


def test_normalize_bbox_bpt_epsilon_is_default():
    v = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    assert normalize_bbox(v)[1, 0] == pytest.approx(1.9 / (2.0 + 1e-6), abs=0)


@pytest.mark.parametrize("eps", [0.0, 1e-6])  # BPT's default eps made the check pass a cloud of one point
def test_normalize_bbox_rejects_a_single_point(eps):
    with pytest.raises(MeshInputError, match="zero size"):
        normalize_bbox(np.zeros((3, 3)), eps=eps)


def test_quantize_matches_bpt_discretize_including_half_to_even():
    assert quantize(np.array([-1.0, 1.0, 0.0])).tolist() == [0, 127, 64]
    # (t + 1) / 2 * 128 - 0.5 == 2.5 exactly: numpy rounds half to even -> 2, not 3
    assert quantize(np.array([-0.953125])).tolist() == [2]
    assert quantize(np.array([-5.0, 5.0])).tolist() == [0, 127]  # clipped


def test_dequantize_gives_bin_centres_and_inverts_quantize():
    bins = np.arange(128)
    np.testing.assert_allclose(dequantize(bins)[[0, 127]], [-1 + 1 / 128, 1 - 1 / 128])
    assert np.array_equal(quantize(dequantize(bins)), bins)
    assert np.array_equal(quantize(dequantize(np.arange(512), bits=9), bits=9), np.arange(512))


def test_merge_vertices_remaps_faces():
    coords = np.array([[5, 5, 5], [1, 1, 1], [5, 5, 5], [2, 2, 2]])
    unique, faces = merge_vertices(coords, np.array([[0, 1, 2], [1, 2, 3]]))
    assert unique.tolist() == [[1, 1, 1], [2, 2, 2], [5, 5, 5]]
    assert faces.tolist() == [[2, 0, 2], [0, 2, 1]]


def test_clean_faces_counts_degenerate_and_duplicate():
    faces = np.array([[0, 1, 2], [2, 1, 0], [1, 2, 0], [3, 3, 1], [0, 1, 3]])
    kept, degenerate, duplicate = clean_faces(faces)
    assert kept.tolist() == [[0, 1, 2], [0, 1, 3]]  # first occurrence and its winding kept
    assert (degenerate, duplicate) == (1, 2)


def test_remove_unreferenced_keeps_order():
    v = np.arange(15.0).reshape(5, 3)
    out_v, out_f = remove_unreferenced(v, np.array([[4, 1, 3]]))
    assert out_v[:, 0].tolist() == [3.0, 9.0, 12.0]
    assert out_f.tolist() == [[2, 0, 1]]


def test_quantize_mesh_merges_close_vertices_and_drops_collapsed_faces():
    # vertices 1 and 3 fall in the same 7-bit bin; face [1, 2, 3] collapses
    v = np.array(
        [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.5, 0.0], [0.501, 0.0, 0.0], [0.9, 0.9, 0.9]]
    )
    coords, faces = quantize_mesh(v, np.array([[0, 1, 2], [1, 2, 3], [0, 3, 2]]))
    assert len(coords) == 3 and len(faces) == 1  # 1 and 3 merged, 2 faces cleaned, vertex 4 unreferenced
    assert coords[faces[0]].tolist() == [
        [64, 64, 64],
        [96, 64, 64],
        [64, 96, 64],
    ]  # winding kept
