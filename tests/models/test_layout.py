"""Decode layout: column-major Linear storage keeps every value, tie and output; the env switch works."""

from __future__ import annotations

import pytest
import torch

from specgen.errors import UsageError
from specgen.models.layout import ENV, decode_layout, layout_name
from tests.conftest import tiny_model


def test_column_major_weights_give_the_same_model(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    row = tiny_model(3, tie_embeddings=True)
    col = decode_layout(tiny_model(3, tie_embeddings=True))
    lin = col.layers[0].attention.wqkv.weight
    assert lin.stride(0) == 1 and not lin.is_contiguous()  # storage [in, out]
    assert col.output.weight is col.tok_embeddings.weight  # a tie stays a tie
    for (name, a), (_, b) in zip(row.state_dict().items(), col.state_dict().items()):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, 64, (2, 9))
    pos = torch.arange(9).expand(2, -1)
    with torch.inference_mode():
        torch.testing.assert_close(col(tokens, pos)[0], row(tokens, pos)[0], rtol=1e-5, atol=1e-5)
        for s in (1, 2, 5):  # cached decode steps of several widths
            cr, cc = row.new_cache(2, 32), col.new_cache(2, 32)
            for m, c in ((row, cr), (col, cc)):
                m(tokens, pos, c)
                for r in range(2):
                    c.commit(r, list(range(9)))
            new, npos = tokens[:, :s], torch.arange(9, 9 + s).expand(2, -1)
            torch.testing.assert_close(col(new, npos, cc)[0], row(new, npos, cr)[0], rtol=1e-5, atol=1e-5)


def test_layout_switch(monkeypatch):
    monkeypatch.setenv(ENV, "row")
    model = decode_layout(tiny_model(0))
    assert model.layers[0].attention.wqkv.weight.is_contiguous()
    monkeypatch.setenv(ENV, "diagonal")
    with pytest.raises(UsageError, match=ENV):
        layout_name()
