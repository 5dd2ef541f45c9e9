"""native/tiled.c (and bfloat16 on AMX, oneDNN slices): products equal to F.linear up to rounding, and the same bits
for a row at every row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specgen import native
from specgen.decoding.target import ModelTarget
from specgen.devices import onednn_packs
from specgen.models import kernel_choice, native_block, packed_linear
from specgen.models.layout import decode_layout
from specgen.models.packed_linear import pack_linears
from specgen.models.prompt import prompt_mode
from specgen.native import ops
from tests.conftest import needs_native, needs_onednn, needs_tiled, tiny_model

pytestmark = needs_tiled


def linear(x, tiles, bias, n):
    return torch.ops.specgen.tiled_linear(x, tiles, bias, n, torch.get_num_threads())


@pytest.mark.parametrize("rows, k, n, bias", [
    (1, 24, 40, True),  # n < one tile
    (5, 33, 100, False),  # n past two tiles, k odd
    (17, 64, 96, True),  # rows past two register blocks, n whole tiles
    (8, 1, 7, True),  # k = 1
    (3, 576, 960, False),  # SmolLM2's wqkv
])
def test_products_equal_f_linear(rows, k, n, bias):
    torch.manual_seed(rows * 1000 + k)
    w, x = torch.randn(n, k), torch.randn(rows, k)
    b = torch.randn(n) if bias else None
    with torch.inference_mode():
        got = linear(x, *ops.tile(w, b), n)
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4 * k ** 0.5)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_any_place():
    torch.manual_seed(0)
    n, k = 100, 70
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(13, k)
    tiles = ops.tile(w, b)
    with torch.inference_mode():
        alone = torch.cat([linear(x[i:i + 1], *tiles, n) for i in range(13)])
        together = linear(x, *tiles, n)
        order = torch.randperm(13)
        shuffled = linear(x[order], *tiles, n)
    assert torch.equal(together, alone) and torch.equal(shuffled, alone[order])


def test_the_vector_width_changes_no_sum():
    """tiled.c picks its register block by the instruction set it is built for (AVX-512: 48-column tiles, AVX2:
    16). A build without AVX-512 (the only build on an AVX2-only CPU) computes the same bits as this CPU's own build:
    every output is the same fused multiply-add chain over k, whatever the tile it sits in."""
    import ctypes

    path, _ = native.compile_library("tiled", native.FLAGS + ("-mno-avx512f",))
    if path is None:
        pytest.skip("this compiler cannot build tiled.c without AVX-512")
    lib = ctypes.CDLL(str(path))
    lib.specgen_tiled_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    torch.manual_seed(3)
    n, k = 100, 70
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(13, k)
    with torch.inference_mode():
        own = linear(x, *ops.tile(w, b), n)
        width = lib.specgen_tiled_width()
        pad = -n % width
        tiles = torch.cat([w, w.new_zeros(pad, k)]).reshape(-1, width, k).transpose(1, 2).contiguous()
        bias = torch.cat([b, b.new_zeros(pad)])
        other = torch.empty(13, n)
        lib.specgen_tiled_linear(x.data_ptr(), tiles.data_ptr(), bias.data_ptr(), other.data_ptr(), 13, k, n, 1)
    assert torch.equal(own, other)


def test_the_same_bits_at_every_thread_count():
    """Large products split their tiles among torch's threads (OpenMP builds); each tile has one owner, so a product
    at 2 threads equals the one at 1 bit for bit (the test holds trivially in a one-thread build)."""
    torch.manual_seed(1)
    n, k = 48 * 7 + 5, 300  # 8 tiles, the last partial; 13 x 300 x 341 multiply-adds: past the parallel threshold
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(13, k)
    tiles = ops.tile(w, b)
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            one = linear(x, *tiles, n)
            torch.set_num_threads(2)
            two = linear(x, *tiles, n)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_openmp_only_beside_a_plainly_named_libgomp():
    """A libgomp under another name (a wheel's hashed copy) or another runtime would leave the -fopenmp build loading
    a second OpenMP runtime beside torch's: only libgomp.so.1 itself counts."""
    line = "7f00-7f01 r-xp 00000000 fe:00 42    {}\n"
    assert native.plain_libgomp_loaded(line.format("/site-packages/torch/lib/libgomp.so.1"))
    assert not native.plain_libgomp_loaded(line.format("/site-packages/torch.libs/libgomp-a34b3233.so.1"))
    assert not native.plain_libgomp_loaded(line.format("/opt/intel/lib/libiomp5.so") + "[heap]\n")


def test_leading_dims_and_empty_inputs():
    w = torch.randn(20, 8)
    tiles = ops.tile(w, None)
    x = torch.randn(2, 3, 8)
    with torch.inference_mode():
        assert linear(x, *tiles, 20).shape == (2, 3, 20)
        assert linear(x[:, :0], *tiles, 20).shape == (2, 0, 20)
        torch.testing.assert_close(linear(x, *tiles, 20), x @ w.T)


def test_tiled_for_cpu_products_without_grad_bfloat16_outside_a_prompt(monkeypatch):
    w = torch.randn(4, 4)
    monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: False)
    with torch.inference_mode():
        assert kernel_choice.tiled_products(torch.randn(1, 4), w)
        assert kernel_choice.tiled_products(torch.randn(1, 4).bfloat16(), w.bfloat16())
        with prompt_mode():  # a prefill: float32 stays on tiled.c, bfloat16 takes its faster GEMM
            assert kernel_choice.tiled_products(torch.randn(1, 4), w)
            assert not kernel_choice.tiled_products(torch.randn(1, 4).bfloat16(), w.bfloat16())
        assert not kernel_choice.tiled_products(torch.randn(1, 4).half(), w.half())
    assert not kernel_choice.tiled_products(torch.randn(1, 4), w)  # grad mode on: autograd needs torch's product
    if onednn_packs(torch.bfloat16):  # with AMX, bfloat16 decode products take oneDNN's slices; float32 stays
        monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: True)
        with torch.inference_mode():
            x, wb = torch.randn(1, 4).bfloat16(), w.bfloat16()
            assert kernel_choice.tiled_products(x, wb)  # a weight too small to pay oneDNN's call
            monkeypatch.setattr(kernel_choice, "AMX_MIN_WEIGHT", 16)
            assert kernel_choice.amx_slices(x, wb) and not kernel_choice.tiled_products(x, wb)
            assert kernel_choice.tiled_products(torch.randn(1, 4), w)
            with prompt_mode():
                assert not kernel_choice.amx_slices(x, wb)


def verify_vs_steps(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [5, V] of 5 tokens scored in one verify forward and in 5 one-token AR steps, after a 4-token prompt,
    on a tiny model in `dtype`."""
    target = ModelTarget(decode_layout(tiny_model(0).to(dtype), "packed"))
    prompt, tokens = torch.tensor([[3, 1, 4, 1]]), torch.tensor([[5, 9, 2, 6, 5]])
    caches = [target.model.new_cache(1, 32) for _ in range(2)]
    for cache in caches:
        target.prefill(prompt, cache)
    steps = []
    for i in range(5):
        steps.append(target.forward(tokens[:, i:i + 1], torch.tensor([[4 + i]]), caches[0], None).logits[0, 0])
        caches[0].commit(0, [0])
    chain = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    verify = target.forward(tokens, torch.arange(4, 9)[None], caches[1], chain).logits[0]
    return torch.stack(steps), verify


@needs_native  # the attention's invariance too
@needs_onednn  # the control
@pytest.mark.parametrize("dtype, amx", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_a_verify_forward_scores_every_token_as_its_ar_step_did(monkeypatch, dtype, amx):
    """Every decode step's products run on the tiled loop or, bfloat16 on AMX, oneDNN's 16-row slices (and attention
    and norms native): a verify forward gives each token the logits of its own AR step, bit for bit; with MKL for one
    row and oneDNN for more (as a plan chosen by speed could run them until session 78) it need not."""
    if amx and not (kernel_choice.amx_bf16() and onednn_packs(torch.bfloat16)):
        pytest.skip("no AMX bfloat16 on this CPU")
    monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: amx)
    monkeypatch.setattr(kernel_choice, "AMX_MIN_WEIGHT", 0)  # the tiny model's weights too
    steps, verify = verify_vs_steps(dtype)
    assert torch.equal(steps, verify)

    def by_rows(lin, x):  # control: a kernel chosen by the row count,
        if x.numel() == x.shape[-1]:
            return F.linear(x, lin.weight, lin.bias)
        return torch.ops.mkldnn._linear_pointwise(x, lin.packed_weight(), lin.bias, "none", [], "")

    monkeypatch.setattr(packed_linear.PackedLinear, "forward", by_rows)
    monkeypatch.setattr(native_block, "KINDS", {})  # in the blocks too
    steps, verify = verify_vs_steps()
    torch.testing.assert_close(steps, verify, rtol=1e-4, atol=1e-4)
    assert not torch.equal(steps, verify)  # the test above can fail


@needs_onednn
@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_bfloat16_step_product_gives_each_row_its_bits_alone(monkeypatch, threads, amx):
    """A bfloat16 decode product runs tiled.c over float32 tiles (each row the float32 sum rounded once) or, on AMX,
    oneDNN in 16-row slices: either way each row of an r-row product is the row alone, at any r and place. Control:
    oneDNN's bfloat16 product of SmolLM2's w2 shape (1536 -> 576) unsliced, the one that made n-gram leave AR's text
    on a bfloat16 SmolLM2, gives some row other bits at some row count."""
    if amx and not (kernel_choice.amx_bf16() and onednn_packs(torch.bfloat16)):
        pytest.skip("no AMX bfloat16 on this CPU")
    monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: amx)
    torch.manual_seed(0)
    lin = pack_linears(nn.Linear(1536, 576, bias=False).to(torch.bfloat16))
    with torch.no_grad():
        lin.weight.copy_(torch.randn(576, 1536))
    x = torch.randn(70, 1536).bfloat16()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            alone = torch.cat([lin(x[i:i + 1]) for i in range(70)])
            assert all(torch.equal(lin(x[:r]), alone[:r]) for r in (2, 3, 5, 8, 16, 32, 33, 64, 70))
            assert torch.equal(lin(x.flip(0)), alone.flip(0))  # any place in the slice
            assert torch.equal(lin(x[:6].view(2, 3, 1536)), alone[:6].view(2, 3, 576))  # [B, S, in]
            assert (lin._tiled is None) == amx  # AMX needs no float32 tiles
            want = (x.float() @ lin.weight.float().t()).bfloat16()
            torch.testing.assert_close(alone, want, rtol=1e-2, atol=1e-2)
            packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight, 16)
            dnn = lambda rows: torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], "")  # noqa: E731
            dnn_alone = torch.cat([dnn(x[i:i + 1]) for i in range(70)])
            if onednn_packs(torch.bfloat16):  # the control where this CPU's oneDNN runs bfloat16
                assert not all(torch.equal(dnn(x[:r]), dnn_alone[:r]) for r in (8, 16, 32, 33, 64))
    finally:
        torch.set_num_threads(before)


@needs_onednn
def test_two_slices_run_as_one_call_only_where_that_call_gives_each_slices_bits(monkeypatch):
    """17-32 rows run as one oneDNN call of two slices where `paired` found that call bitwise the two slices' calls
    (one pass over the weights), else as two calls. Control: a product whose rows move with the call's row count
    fails the check, and its rows then stay the bits of 16-row calls."""
    if not onednn_packs(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not pack bfloat16")
    torch.manual_seed(0)
    lin = pack_linears(nn.Linear(64, 48).to(torch.bfloat16))
    x = torch.randn(20, 64).bfloat16()
    calls = []
    real = packed_linear.onednn

    def counted(rows, w, bias):
        calls.append(rows.shape[0])
        return real(rows, w, bias)

    def by_count(rows, w, bias):  # the control: every row's bits depend on the call's row count
        calls.append(rows.shape[0])
        return real(rows, w, bias) + rows.shape[0] * 1e-2

    with torch.inference_mode():
        alone = torch.cat([lin.sliced(x[i:i + 1]) for i in range(20)])
        monkeypatch.setattr(packed_linear, "onednn", counted)
        got = lin.sliced(x)
        assert torch.equal(got, alone) and calls[-1] == (32 if lin.paired() else 16)
        lin._paired = None
        monkeypatch.setattr(packed_linear, "onednn", by_count)
        alone = torch.cat([lin.sliced(x[i:i + 1]) for i in range(20)])
        assert not lin.paired()
        calls.clear()
        assert torch.equal(lin.sliced(x), alone) and calls == [16, 16]


def test_a_fake_product_goes_through_torch_ops():
    """ops.tiled_linear on a fake tensor takes the op's fake kernel (its shape), never the C kernel's pointers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = torch.randn(40, 24)
    tiles, bias = ops.tile(w, None)
    with torch.inference_mode(), FakeTensorMode(allow_non_fake_inputs=True) as fake:
        got = ops.tiled_linear(fake.from_tensor(torch.randn(5, 24)), tiles, bias, 40, 1)
    assert got.shape == (5, 40)
