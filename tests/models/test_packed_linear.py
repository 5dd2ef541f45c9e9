"""PackedLinear: same products as nn.Linear on either kernel, repacked when weights change, safe to copy."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specgen.errors import UsageError
from specgen.models import packed_linear
from specgen.models.layout import ENV, decode_layout, layout_name
from specgen.models.packed_linear import PackedLinear, pack_linears
from specgen.models.prompt import prompt_mode
from tests.conftest import needs_native, needs_onednn, needs_tiled, tiny_model


def packed(in_f: int = 24, out_f: int = 40, bias: bool = True) -> tuple[nn.Linear, PackedLinear]:
    torch.manual_seed(0)
    ref = nn.Linear(in_f, out_f, bias=bias)
    return ref, pack_linears(copy.deepcopy(ref))


@needs_onednn
@needs_tiled
@pytest.mark.parametrize("bias", [True, False])
def test_every_row_count_matches_nn_linear(bias, monkeypatch):
    """float32 products run tiled.c at every row count; where it is not taken (not built), oneDNN's packed copy."""
    ref, lin = packed(bias=bias)
    for tiled in (True, False):
        if not tiled:
            monkeypatch.setattr(packed_linear, "tiled_products", lambda x, w: False)
        with torch.inference_mode():
            for rows in range(1, 7):
                x = torch.randn(rows, 24)
                torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)
                assert (lin._tiled is not None, lin._packed is not None) == (True, not tiled)
            x3 = torch.randn(2, 5, 24)  # [B, S, in]: rows = B * S
            torch.testing.assert_close(lin(x3), ref(x3), rtol=1e-5, atol=1e-5)
            xt = torch.randn(24, 4).t()  # a non-contiguous input
            torch.testing.assert_close(lin(xt), ref(xt), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_changed_weight_is_repacked():
    ref, lin = packed()
    x = torch.randn(5, 24)
    with torch.inference_mode():
        lin(x)  # packs
    with torch.no_grad():
        lin.weight.add_(0.5)  # in place, like a LoRA merge
        ref.weight.add_(0.5)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)
    lin.weight.data = torch.zeros_like(lin.weight)  # storage replaced
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), lin.bias.expand(5, -1), rtol=0, atol=0)


@needs_onednn
def test_weights_made_under_inference_mode_pack():
    """A copy made inside a decode loop (e.g. XSpecMesh's bf16 LM head) has inference-tensor weights."""
    ref, lin = packed()
    x = torch.randn(5, 24)
    with torch.inference_mode():
        copy_ = copy.deepcopy(lin).to(torch.float64).to(torch.float32)  # weights re-made: inference tensors
        assert copy_.weight.is_inference()
        torch.testing.assert_close(copy_(x), ref(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_gradients_fall_back_to_autograd():
    ref, lin = packed()
    x = torch.randn(6, 24, requires_grad=True)
    lin(x).square().sum().backward()
    g = x.grad.clone()
    x.grad = None
    ref(x).square().sum().backward()
    torch.testing.assert_close(g, x.grad)
    assert lin.weight.grad is not None


@needs_onednn
def test_deepcopy_and_dtype_change():
    ref, lin = packed()
    x = torch.randn(5, 24)
    with torch.inference_mode():
        lin(x)  # holds a packed (opaque, storage-less) copy now
    bf = copy.deepcopy(lin).to(torch.bfloat16)
    with torch.inference_mode():
        torch.testing.assert_close(bf(x.bfloat16()).float(), F.linear(x.bfloat16(), ref.weight.bfloat16(),
                                   ref.bias.bfloat16()).float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)  # the original is untouched


@needs_onednn
def test_a_cpu_whose_onednn_refuses_bfloat16_runs_it_unpacked(monkeypatch):
    """An AVX2-only CPU: oneDNN packs float32 but raises on bfloat16 weights. Nothing bfloat16 may be packed or sent
    to oneDNN there (every bfloat16 and quantized model crashed on such a CPU), and float32 still packs."""
    from specgen.models import kernel_choice

    monkeypatch.setattr(kernel_choice, "onednn_packs", lambda dtype: dtype == torch.float32)
    ref, lin = packed()
    bf = copy.deepcopy(lin).to(torch.bfloat16)  # packed as float32, then turned bfloat16
    x = torch.randn(5, 24)
    with torch.inference_mode(), prompt_mode():
        torch.testing.assert_close(bf(x.bfloat16()), F.linear(x.bfloat16(), bf.weight, bf.bias))
        assert bf._packed is None
        lin(x)
        assert lin._packed is None and lin._tiled is not None  # float32: tiled.c, prompts too
    model = pack_linears(tiny_model(1).to(torch.bfloat16))  # PackedLinears for their decode steps (tiled.c)
    with torch.inference_mode(), prompt_mode():
        model(torch.zeros(1, 5, dtype=torch.long), torch.arange(5)[None])
    assert all(m._packed is None for m in model.modules() if type(m) is PackedLinear)
    monkeypatch.setattr("specgen.devices.onednn_packs", lambda dtype: dtype == torch.float32)


@needs_onednn
def test_decode_layout_packs_by_default_and_keeps_the_model(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert layout_name() == "packed"
    row = tiny_model(3, tie_embeddings=True)
    dec = decode_layout(tiny_model(3, tie_embeddings=True))
    assert all(type(m) is PackedLinear for m in dec.modules() if isinstance(m, nn.Linear))
    assert dec.output.weight is dec.tok_embeddings.weight
    for (name, a), (_, b) in zip(row.state_dict().items(), dec.state_dict().items()):
        assert torch.equal(a, b), name
    monkeypatch.setenv(ENV, "col")
    col = decode_layout(tiny_model(3))
    assert not any(type(m) is PackedLinear for m in col.modules())


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_on_packed_weights_stays_lossless(dtype):
    """Greedy Jacobi / n-gram / random-tree drafts on packed weights equal AR on them."""
    from specgen.methods.options import JacobiOptions
    from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
    from tests.decoding.test_lossless_text import GREEDY, RandomTreeDrafter, run

    model = pack_linears(decode_layout(tiny_model(1).to(dtype), "col"))
    prompt = [int(t) for t in torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1))]
    ar = run(model, EmptyDrafter(), prompt)
    assert GREEDY.greedy and len(ar) == 40
    for drafter in (JacobiDrafter(JacobiOptions(4)), JacobiDrafter(JacobiOptions(9)), NgramDrafter(),
                    RandomTreeDrafter(ar, len(prompt))):
        assert run(model, drafter, prompt) == ar


@needs_onednn
@needs_native
def test_a_model_too_large_to_copy_gets_no_copies(monkeypatch):
    """Above MAX_MEMORY_SHARE a float32 model is held as tiles only (every product on tiled.c: its decode steps stay
    row-invariant, and no second copy is made); a bfloat16 one stays as it is (its tiles would be float32 copies)."""
    from specgen.models.tiled_weight import TiledWeight

    model = tiny_model(3)
    size = sum(w.numel() * 4 for w in {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
               .values())  # float32 Linear weights, a tied one once
    # weights + two copies would pass half of RAM (weights > 1/6 of it)
    monkeypatch.setattr(packed_linear, "available_memory", lambda: size * 5)
    large = decode_layout(copy.deepcopy(model), "packed")
    assert all(type(m) is PackedLinear and type(m.weight) is TiledWeight
               for m in large.modules() if isinstance(m, nn.Linear))
    monkeypatch.setattr(packed_linear, "available_memory", lambda: size * 2)  # bfloat16: half the bytes
    bf = pack_linears(copy.deepcopy(model).to(torch.bfloat16))
    assert not any(type(m) is PackedLinear for m in bf.modules())
    monkeypatch.setattr(packed_linear, "available_memory", lambda: size * 7)
    pack_linears(model)
    assert all(type(m) is PackedLinear for m in model.modules() if isinstance(m, nn.Linear))


def test_builds_without_onednn_fall_back_to_column_major(monkeypatch):
    monkeypatch.setattr(packed_linear, "available", lambda: False)
    monkeypatch.delenv(ENV, raising=False)
    assert layout_name() == "col"
    model = decode_layout(tiny_model(3))
    assert not any(type(m) is PackedLinear for m in model.modules())
    assert model.layers[0].attention.wqkv.weight.stride(0) == 1  # still column-major
    monkeypatch.setenv(ENV, "packed")
    with pytest.raises(UsageError, match="oneDNN"):
        layout_name()
