"""BPT tokenizer: vocabulary, hand-derived token sequences, decoding and decode errors.

Expected sequences below were worked out by hand from the scheme (research/mesh_peers.md 1.2)
and agree with the public BPT serializer. Inputs are given as 7-bit bins and fed as bin centres.
Block = x//16*64 + y//16*8 + z//16; offset = 512 + x%16*256 + y%16*16 + z%16.
"""

import numpy as np
import pytest

from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.quantize import dequantize
from specgen.mesh.tokenizers import BPTTokenizer
from tests.mesh.mesh_fixtures import TOKENIZERS, canonical_triangles

TOK = BPTTokenizer()

# Tetrahedron, outward winding. A, B, C, D = bins (0,0,0), (20,0,0), (0,20,0), (0,0,20).
TETRA_BINS = np.array([[0, 0, 0], [20, 0, 0], [0, 20, 0], [0, 0, 20]])
TETRA_FACES = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
# Sort (coarse block, y, x, z): A, D, B, C -> 0..3. Faces become (0,2,1) (0,1,3) (0,3,2) (1,2,3).
# Patch 1: centre A (all degrees 3, first wins); fan edges (1,2) (1,3) (2,3) have no open end,
#   so start at 1; walk 1-2-3-1; (A, D, B) has the wrong winding -> ring reversed: D C B D.
# Patch 2: the face (1,2,3): centre D, ring B C.
# Tokens: A: block 0 + off 512; D: 1, 516; C: 8, 576; B: 64, 1536; D: 1, 516;
#   special block 1+4608, 516; B: 64, 1536; C: 8, 576; EOS.
TETRA_TOKENS = [0, 512, 1, 516, 8, 576, 64, 1536, 1, 516, 4609, 516, 64, 1536, 8, 576, 5120]

# Open quad (two triangles), all in block 0: P0 (1,1,5) P1 (3,1,5) P2 (3,3,5) P3 (1,3,5).
QUAD_BINS = np.array([[1, 1, 5], [3, 1, 5], [3, 3, 5], [1, 3, 5]])
QUAD_FACES = np.array([[0, 1, 2], [0, 2, 3]])
# One patch: centre P0, ring P1 P2 P3; every vertex shares block 0, so offsets only.
QUAD_TOKENS = [0, 789, 1301, 1333, 821, 5120]

# Two separate triangles in block 0: the second patch's centre gets special block 4608 and the
# next vertex re-emits plain block 0 although it is in the same block (BPT's quirk).
TWO_BINS = np.array([[1, 1, 1], [2, 1, 1], [1, 2, 1], [1, 1, 3], [2, 1, 3], [1, 2, 3]])
TWO_FACES = np.array([[0, 1, 2], [3, 4, 5]])
TWO_TOKENS = [0, 785, 1041, 801, 4608, 787, 0, 1043, 803, 5120]


def test_vocabulary_and_special_ids():
    assert TOKENIZERS["bpt"] is BPTTokenizer
    assert TOK.vocab_size == 5121 and TOK.eos_id == 5120
    assert (TOK.offset_base, TOK.special_base, TOK.bits) == (512, 4608, 7)
    assert not hasattr(TOK, "bos_id")  # BPT sequences have no BOS (the condition starts them) and no PAD id


@pytest.mark.parametrize(
    "bins, faces, expected",
    [
        (TETRA_BINS, TETRA_FACES, TETRA_TOKENS),
        (QUAD_BINS, QUAD_FACES, QUAD_TOKENS),
        (TWO_BINS, TWO_FACES, TWO_TOKENS),
    ],
    ids=["tetrahedron", "quad", "two-triangles-quirk"],
)
def test_known_answer_sequences(bins, faces, expected):
    tokens = TOK.encode(dequantize(bins), faces)
    assert tokens.tolist() == expected
    assert TOK.encode(dequantize(bins), faces, add_eos=False).tolist() == expected[:-1]


@pytest.mark.parametrize(
    "bins, faces", [(TETRA_BINS, TETRA_FACES), (QUAD_BINS, QUAD_FACES), (TWO_BINS, TWO_FACES)]
)
def test_decode_recovers_faces_with_winding(bins, faces):
    v, f = TOK.decode(TOK.encode(dequantize(bins), faces))
    assert canonical_triangles(v, f) == canonical_triangles(dequantize(bins), faces)


def test_encoding_ignores_input_vertex_and_face_order():
    perm = np.array([2, 0, 3, 1])
    inv = np.argsort(perm)
    faces = inv[TETRA_FACES][::-1][:, [1, 2, 0]]  # relabel, reverse order, rotate each face
    assert TOK.encode(dequantize(TETRA_BINS[perm]), faces).tolist() == TETRA_TOKENS


def test_token_kinds():
    kinds = TOK.kinds([0, 511, 512, 4607, 4608, 5119, 5120, 5121, -1])
    assert kinds.tolist() == [0, 0, 1, 1, 2, 2, 3, -1, -1]


def test_decode_stops_at_eos():
    _, f = TOK.decode(QUAD_TOKENS + [9999, 3])
    assert len(f) == 2


def test_inconsistent_winding_is_normalised_along_a_fan():
    # second face wound against the first: lossy, geometry kept, one winding flipped
    faces = np.array([[0, 1, 2], [0, 3, 2]])
    v, f = TOK.decode(TOK.encode(dequantize(QUAD_BINS), faces))
    assert canonical_triangles(v, f, oriented=False) == canonical_triangles(
        dequantize(QUAD_BINS), faces, oriented=False
    )
    assert canonical_triangles(v, f) != canonical_triangles(dequantize(QUAD_BINS), faces)


def test_encode_rejects_unnormalised_or_empty_meshes():
    with pytest.raises(MeshInputError, match="normalise"):
        TOK.encode(QUAD_BINS.astype(float), QUAD_FACES)
    with pytest.raises(MeshInputError, match="no non-degenerate faces"):
        TOK.encode(np.zeros((3, 3)), np.array([[0, 1, 2]]))


@pytest.mark.parametrize(
    "tokens, position, reason",
    [
        ([], 0, "empty"),
        ([5120], 0, "empty"),
        ([0, 512, 513, 9999, 514], 3, "outside the vocabulary"),
        ([0, 512, 513, -1, 514], 3, "outside the vocabulary"),
        ([0, 3, 512, 513, 514], 0, "block token not followed"),
        ([0, 512, 513, 514, 4608, 8], 4, "block token not followed"),
        ([0, 512, 513, 514, 4608, 515], 4, "patch has 1 vertices"),
        ([0, 512, 513, 514, 4608, 515, 516], 4, "patch has 2 vertices"),
        ([512, 513, 514], 0, "offset token before any block"),
    ],
)
def test_decode_errors_report_position(tokens, position, reason):
    with pytest.raises(MeshDecodeError, match=reason) as info:
        TOK.decode(tokens)
    assert info.value.position == position
    assert isinstance(info.value, ValueError)


def test_tolerant_decode_skips_bad_patches_like_bpt():
    # a bad id and a one-vertex patch in the middle: the good fans survive
    tokens = [0, 512, 513, 9999, 514, 4608, 515, 4608, 520, 521, 522, 5120]
    out = TOK.decode_partial(tokens)
    assert [e.position for e in out.errors] == [3, 5]
    assert len(out.faces) == 2
    # an offset before any block uses block 0, as BPT's decoder
    out = TOK.decode_partial([512, 513, 514])
    assert len(out.faces) == 1 and out.errors[0].position == 0
    np.testing.assert_allclose(out.vertices[0], dequantize(np.array([0, 0, 0])))


def test_decode_rejects_non_1d_input():
    with pytest.raises(MeshInputError):
        TOK.decode(np.zeros((2, 3), dtype=np.int64))
