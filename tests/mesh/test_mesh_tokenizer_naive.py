"""Naive 9-tokens-per-face tokenizer: vocabulary, a hand-derived sequence and decode errors."""

import numpy as np
import pytest

from specgen.mesh.errors import MeshDecodeError
from specgen.mesh.quantize import dequantize
from tests.mesh.mesh_fixtures import TOKENIZERS, canonical_triangles
from tests.mesh.naive_tokenizer import NaiveTokenizer

TOK = NaiveTokenizer()
TETRA_BINS = np.array([[0, 0, 0], [20, 0, 0], [0, 20, 0], [0, 0, 20]])  # A B C D (x, y, z)
TETRA_FACES = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
# z-y-x sort keeps A B C D as 0..3; faces sorted by index set: ACB, ABD, ADC, BCD;
# each vertex written (z, y, x): A 0 0 0, B 0 0 20, C 0 20 0, D 20 0 0.
TETRA_TOKENS = [
    0, 0, 0, 0, 20, 0, 0, 0, 20,
    0, 0, 0, 0, 0, 20, 20, 0, 0,
    0, 0, 0, 20, 0, 0, 0, 20, 0,
    0, 0, 20, 0, 20, 0, 20, 0, 0,
    129,
]  # fmt: skip


def test_vocabulary_and_special_ids():
    assert TOKENIZERS["naive"] is NaiveTokenizer
    assert (TOK.vocab_size, TOK.bos_id, TOK.eos_id, TOK.pad_id) == (131, 128, 129, 130)
    assert NaiveTokenizer(bits=8).vocab_size == 259


def test_known_answer_tetrahedron():
    assert TOK.encode(dequantize(TETRA_BINS), TETRA_FACES).tolist() == TETRA_TOKENS


def test_round_trip_with_bos_and_winding():
    v, f = TOK.decode([TOK.bos_id] + TETRA_TOKENS)
    assert canonical_triangles(v, f) == canonical_triangles(dequantize(TETRA_BINS), TETRA_FACES)


@pytest.mark.parametrize(
    "tokens, position, reason",
    [
        (TETRA_TOKENS[:10], 9, "incomplete face: 1 of 9"),
        ([128] + TETRA_TOKENS[:12], 10, "incomplete face: 3 of 9"),
        (TETRA_TOKENS[:4] + [130] + TETRA_TOKENS[5:], 4, "not a coordinate"),
        ([128, 128] + TETRA_TOKENS[:9], 1, "not a coordinate"),
        ([129], 0, "empty"),
    ],
)
def test_decode_errors_report_position(tokens, position, reason):
    with pytest.raises(MeshDecodeError, match=reason) as info:
        TOK.decode(tokens)
    assert info.value.position == position


def test_tolerant_decode_keeps_good_faces():
    tokens = TETRA_TOKENS[:4] + [130] + TETRA_TOKENS[5:-1] + [1, 2]
    out = TOK.decode_partial(tokens)
    assert [e.position for e in out.errors] == [4, 36]
    assert len(out.faces) == 3
