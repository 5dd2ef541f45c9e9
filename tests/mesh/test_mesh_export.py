"""Export to every format reloads with the same faces; cleaning counts; atomic writes; PNG."""

import os

import numpy as np
import pytest
import trimesh

from specgen.mesh.errors import MeshInputError
from specgen.mesh.export import EXPORT_FORMATS, clean_mesh, export_mesh, render_png
from specgen.mesh.procedural import generate_mesh

MESH = generate_mesh(5)


@pytest.mark.parametrize("fmt", sorted(EXPORT_FORMATS))
def test_every_format_reloads_with_same_face_count(tmp_path, fmt):
    path = tmp_path / f"mesh.{fmt}"
    assert export_mesh(MESH.vertices, MESH.faces, path) == path
    c = clean_mesh(MESH.vertices, MESH.faces)
    assert (len(c.faces), c.degenerate_removed, c.duplicate_removed) == (len(MESH.faces), 0, 0)
    back = trimesh.load(path, force="mesh")  # default processing merges STL's split vertices
    assert len(back.faces) == len(MESH.faces)
    assert len(back.vertices) == len(MESH.vertices)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_export_counts_removed_faces_and_format_option(tmp_path):
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [2, 0, 0]], float)
    faces = np.array([[0, 1, 2], [2, 1, 0], [0, 1, 4], [0, 1, 5], [0, 2, 3]])
    export_mesh(v, faces, tmp_path / "out.bin", fmt="ply")
    # [2,1,0] duplicates [0,1,2]; [0,1,4] repeats vertex 1 after merging; [0,1,5] has no area
    c = clean_mesh(v, faces)
    assert (len(c.faces), c.duplicate_removed, c.degenerate_removed) == (2, 1, 2)
    back = trimesh.load(tmp_path / "out.bin", file_type="ply", process=False)
    assert (len(back.faces), len(back.vertices)) == (2, 4)


def test_clean_mesh_keeps_winding_and_first_appearance_order():
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0]], float)
    c = clean_mesh(v, np.array([[0, 1, 3]]))
    assert c.faces.tolist() == [[0, 1, 2]]
    assert c.vertices.tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 0]]


def test_bad_format_and_empty_mesh_write_nothing(tmp_path):
    with pytest.raises(MeshInputError, match="unknown mesh format 'fbx'"):
        export_mesh(MESH.vertices, MESH.faces, tmp_path / "a.fbx")
    with pytest.raises(MeshInputError, match="no non-degenerate faces"):
        export_mesh(np.zeros((3, 3)), np.array([[0, 1, 2]]), tmp_path / "a.obj")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_old_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "keep.obj"
    path.write_text("old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        export_mesh(MESH.vertices, MESH.faces, path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.obj"]


def test_png_preview(tmp_path):
    path = render_png(MESH.vertices, MESH.faces, tmp_path / "preview.png", size=128)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert [p.name for p in tmp_path.iterdir()] == ["preview.png"]
