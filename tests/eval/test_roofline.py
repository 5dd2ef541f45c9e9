"""The roofline's inputs: weight bytes one forward streams, and a copy bandwidth that is a plausible number."""

from __future__ import annotations

from specgen.eval.roofline import copy_bandwidth, streamed_bytes
from tests.conftest import tiny_model


def test_streamed_bytes_count_the_lm_head_once_and_skip_lookup_tables():
    tied, untied = tiny_model(0, tie_embeddings=True), tiny_model(0, tie_embeddings=False)
    every = lambda m: sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])  # noqa: E731
    rope = tied.rope_table.numel() * tied.rope_table.element_size()
    embed = untied.tok_embeddings.weight.numel() * 4
    assert streamed_bytes(tied) == every(tied) - rope  # the shared table is the LM head: read once per step
    assert streamed_bytes(untied) == every(untied) - rope - embed  # a lookup reads one row of the embedding


def test_copy_bandwidth_is_measured():
    gbs = copy_bandwidth(megabytes=16, rounds=2)
    assert 0.1 < gbs < 10_000
