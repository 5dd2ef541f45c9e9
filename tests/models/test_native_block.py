"""models/native_block.py: a block's decode forward without its modules computes, bit for bit, what the modules do."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.target import ModelTarget
from specgen.devices import onednn_packs
from specgen.models import kernel_choice, native_block
from specgen.models.layout import decode_layout
from specgen.models.quantize import quantize_model
from tests.conftest import needs_native, tiny_model

pytestmark = needs_native

REAL_USABLE = native_block.usable


def counted_usable(monkeypatch, fast: bool) -> list:
    """A list that gets an entry per block forward taking the native path (`fast` False: none does)."""
    taken: list = []

    def spy(*args):
        kind = REAL_USABLE(*args) if fast else None
        taken.extend([1] if kind else [])
        return kind

    monkeypatch.setattr(native_block, "usable", spy)
    return taken


def decode(monkeypatch, fast: bool, quantized: str = "", dtype: torch.dtype = torch.float32, **over
           ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """(logits of a prefill, three AR steps and a 4-node tree verify; every layer's cache keys and values; how many
    block forwards took the native path) on a tiny model in `dtype` (float32: its products on tiled.c; bfloat16: on
    tiled.c over float32 tiles or oneDNN's AMX slices), or on it `quantized` ("int8", "int4": qmm.c's products,
    bfloat16 activations)."""
    taken = counted_usable(monkeypatch, fast)
    model = tiny_model(1, **over).to(dtype)
    target = ModelTarget(quantize_model(model, quantized, 32) if quantized else decode_layout(model, "packed"))
    cache = target.model.new_cache(2, 32)
    logits = [target.prefill(torch.tensor([[3, 1, 4, 1], [2, 7, 1, 8]]), cache).logits]
    for i in range(3):
        out = target.forward(torch.tensor([[5 + i], [9 - i]]), torch.tensor([[4 + i], [4 + i]]), cache, None)
        logits.append(out.logits)
        for row in range(2):
            cache.commit(row, [0])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    tokens, positions = torch.tensor([[2, 6, 5, 3]] * 2), torch.tensor([[7, 8, 8, 9]] * 2)
    logits.append(target.forward(tokens, positions, cache, tree).logits)
    kv = [t.clone() for layer in range(target.model.cfg.n_layers) for t in cache.layers[layer]]
    return logits, kv, len(taken)


@pytest.mark.parametrize("over", [{}, {"qkv_bias": True}, {"n_kv_heads": 4}])
def test_the_native_block_equals_the_module_path_bit_for_bit(monkeypatch, over):
    """Prefill, AR steps over two rows and a tree verify: the same logits and cache contents with the block in one
    run of native calls as through its modules (the same kernels in the same order)."""
    fast_logits, fast_kv, taken = decode(monkeypatch, True, **over)
    slow_logits, slow_kv, none = decode(monkeypatch, False, **over)
    assert taken > 0 and none == 0
    assert all(torch.equal(a, b) for a, b in zip(fast_logits, slow_logits))
    assert all(torch.equal(a, b) for a, b in zip(fast_kv, slow_kv))


@pytest.mark.parametrize("amx", [False, True])
def test_a_bfloat16_block_equals_its_modules_bit_for_bit(monkeypatch, amx):
    """The same in bfloat16: products over float32 tiles, or (`amx`, where this CPU has AMX) oneDNN's 16-row slices,
    the tiny model's small weights too; the prefill keeps the module path (prompt mode: oneDNN unsliced)."""
    if amx and not (kernel_choice.amx_bf16() and onednn_packs(torch.bfloat16)):
        pytest.skip("no AMX bfloat16 on this CPU")
    monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: amx)
    monkeypatch.setattr(kernel_choice, "AMX_MIN_WEIGHT", 0)
    fast_logits, fast_kv, taken = decode(monkeypatch, True, dtype=torch.bfloat16)
    slow_logits, slow_kv, none = decode(monkeypatch, False, dtype=torch.bfloat16)
    assert taken == 2 * 4 and none == 0  # 2 layers x (3 AR steps + the tree verify)
    assert fast_logits[1].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(fast_logits, slow_logits))
    assert all(torch.equal(a, b) for a, b in zip(fast_kv, slow_kv))


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("over", [{}, {"qkv_bias": True}])
def test_a_quantized_block_equals_its_modules_bit_for_bit(monkeypatch, mode, over):
    """The same on a quantized model (qmm.c's products, bfloat16 activations, the fused w13 of its feed-forward); the
    prefill keeps the module path (prompt mode may take one bfloat16 GEMM), every later forward takes the native run."""
    fast_logits, fast_kv, taken = decode(monkeypatch, True, mode, **over)
    slow_logits, slow_kv, none = decode(monkeypatch, False, mode, **over)
    assert taken == 2 * 4 and none == 0  # 2 layers x (3 AR steps + the tree verify)
    assert fast_logits[0].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(fast_logits, slow_logits))
    assert all(torch.equal(a, b) for a, b in zip(fast_kv, slow_kv))


def test_a_cross_attention_block_equals_its_modules_bit_for_bit(monkeypatch):
    """The mesh decoder's blocks (self-attention, cross-attention to a condition, SwiGLU): AR steps over two rows and
    a tree verify give the same logits and cache through the native run as through the modules."""
    def run(fast: bool) -> tuple[list[torch.Tensor], int]:
        taken = counted_usable(monkeypatch, fast)
        model = decode_layout(tiny_model(3, cross_dim=24), "packed")
        cache = model.new_cache(2, 32)
        with torch.inference_mode():
            cache.cross = model.context_kv(torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(0)))
            out = [model(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.arange(3).expand(2, 3), cache)[0]]
            for row in range(2):
                cache.commit(row, [0, 1, 2])
            for i in range(2):
                out.append(model(torch.tensor([[7 + i], [9 - i]]), torch.tensor([[3 + i]] * 2), cache)[0])
                for row in range(2):
                    cache.commit(row, [0])
            tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
            out.append(model(torch.tensor([[2, 6, 5]] * 2), torch.tensor([[5, 6, 6]] * 2), cache, tree)[0])
        return out + [t.clone() for layer in range(model.cfg.n_layers) for t in cache.layers[layer]], len(taken)

    fast, taken = run(True)
    slow, none = run(False)
    assert taken > 0 and none == 0
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def test_the_native_block_needs_a_product_kind_it_knows(monkeypatch):
    """Every float32 decode step's products run on tiled.c, so the native block runs them; without a product kind it
    knows (a plain nn.Linear, a LoRA wrapper) a block keeps the module path."""
    _, _, taken = decode(monkeypatch, True)
    assert taken > 0
    monkeypatch.setattr(native_block, "KINDS", {})  # control: no product kind the block knows
    _, _, taken = decode(monkeypatch, True)
    assert taken == 0


def test_not_usable_with_gradients_other_dtypes_or_q_k_norms(monkeypatch):
    from specgen.models.attention import native_plan

    model = decode_layout(tiny_model(2), "packed")
    blk = model.layers[0]
    x = torch.randn(1, 1, model.cfg.dim)
    plan = native_plan(None, 1, 1, 1, model.cfg.n_heads, model.cfg.hd, [0], torch.float32)
    with torch.inference_mode():
        assert native_block.usable(blk, x, plan, None)
        assert not native_block.usable(blk, x.bfloat16(), plan, None)
        assert not native_block.usable(blk, x, None, None)  # no plan: SDPA's path (e.g. a prompt prefill)
        assert not native_block.usable(blk, x, plan, ["cross kv"])  # a condition for a block without cross-attention
        blk.feed_forward.w2 = torch.nn.Linear(model.cfg.ffn_dim, model.cfg.dim, bias=False)  # e.g. a LoRA wrapper
        assert not native_block.usable(blk, x, plan, None)
    qk = decode_layout(tiny_model(2, qk_norm=True), "packed")
    with torch.inference_mode():
        assert not native_block.usable(qk.layers[0], x, plan, None)
    assert not native_block.usable(model.layers[1], x, plan, None)  # grad mode on
