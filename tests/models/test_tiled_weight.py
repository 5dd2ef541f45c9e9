"""A float32 weight, whose every product runs tiled.c, is held once, as its tiles: same values, same products."""

from __future__ import annotations

import copy
import pickle
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specgen import checkpoints, registry
from specgen.decoding.target import ModelTarget
from specgen.models import layout_cache
from specgen.models.layout import decode_layout
from specgen.models.packed_linear import PackedLinear, pack_linears
from specgen.models.tiled_weight import TiledWeight
from tests.conftest import needs_onednn, needs_tiled, tiny_model

pytestmark = [needs_tiled, needs_onednn]


@pytest.mark.parametrize("n", [40, 32, 5])  # partial last tile, whole tiles, one partial tile
def test_a_tiled_weight_reads_and_writes_as_its_values(n):
    torch.manual_seed(n)
    w = torch.randn(n, 24)
    p = TiledWeight.of(w)
    assert isinstance(p, nn.Parameter) and torch.equal(p.dense(), w) and torch.equal(p * 1, w)
    idx = torch.tensor([[0, n - 1, 3 % n]])
    assert torch.equal(nn.functional.embedding(idx, p), w[idx])  # gathered from the tiles
    with torch.no_grad():
        p.mul_(2)  # an in-place op lands in the tiles
    assert torch.equal(p.dense(), 2 * w)
    lin = nn.Linear(24, n)
    lin.weight = p
    lin.load_state_dict({"weight": w, "bias": torch.zeros(n)})  # a load writes straight into the tiles
    assert type(lin.weight) is TiledWeight and torch.equal(lin.weight.dense(), w)
    for other in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):  # copies are dense parameters
        assert type(other) is nn.Parameter and torch.equal(other, w)


def test_decode_layout_holds_float32_weights_once_with_the_same_products():
    model = decode_layout(tiny_model(1, tie_embeddings=True), "packed")
    two_copies = pack_linears(tiny_model(1, tie_embeddings=True))  # dense weights, tiles made on use
    lins = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert lins and all(type(lin.weight) is TiledWeight for lin in lins)
    assert model.output.weight is model.tok_embeddings.weight  # the tie holds: one copy for both
    dense = [p for p in model.parameters() if type(p) is not TiledWeight]
    assert all(p.dim() == 1 for p in dense)  # only norms stay dense
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        outs = [ModelTarget(m).prefill(tokens, ModelTarget(m).new_cache(1, 32)).logits for m in (model, two_copies)]
        assert torch.equal(*outs)
        assert all(lin._tiled is not None for lin in two_copies.modules() if isinstance(lin, PackedLinear))


def test_a_decode_load_writes_weights_into_their_tiles():
    model = tiny_model(2, tie_embeddings=True)
    entry = registry.save("target", "tiny", model.state_dict(), {"builder": "transformer",
                                                                  "kwargs": model.cfg.to_dict()})
    checkpoints.load_module(entry, decode=True)
    shutil.rmtree(layout_cache.folder())  # the decoded weights not stored: loaded from the checkpoint again
    loaded = checkpoints.load_module(entry, decode=True)
    assert type(loaded.output.weight) is TiledWeight and loaded.output.weight is loaded.tok_embeddings.weight
    for name, p in model.state_dict().items():
        got = loaded.state_dict()[name]
        assert torch.equal(got.dense() if type(got) is TiledWeight else got, p), name


def test_a_dtype_conversion_moves_the_tiles_too():
    """`module.to(bfloat16)` on held tiles: every op then reads the converted values (it had kept float32 tiles)."""
    w = torch.randn(37, 24)
    lin = nn.Linear(24, 37, bias=False)
    lin._parameters["weight"] = TiledWeight.of(w)
    lin.to(torch.bfloat16)
    x = torch.randn(3, 24, dtype=torch.bfloat16)
    assert lin.weight.dtype == torch.bfloat16 and lin.weight.tiles.dtype == torch.bfloat16
    assert torch.equal(lin(x), F.linear(x, w.to(torch.bfloat16)))


def test_a_load_and_a_decode_step_on_tiles_never_import_torch_distributed(fresh_interpreter):
    """torch's first Python dispatch on a subclass imports torch.distributed.tensor (seconds of start-up): the
    calls a load and a decode step make stay above it (tests/startup_checks.py). Control: a dispatched op then does
    import it, so the check sees."""
    assert fresh_interpreter["distributed"] == [False, True]
