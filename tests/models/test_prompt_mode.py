"""Prompt mode (models/prompt.py): a prefill's faster kernels stay inside the prefill, compute the same weights,
and leave every lossless method equal to AR (tests/models/test_quantize.py runs those with the prompt GEMM on)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen.decoding.target import ModelTarget
from specgen.models import prompt, quantize
from specgen.models.quantize import QuantizedLinear, quantize_model
from tests.conftest import dequantized, tiny_model

MODES = [("int8", 0), ("int4", 32)]


def layer(mode: str, group: int, out: int = 96, k: int = 64, seed: int = 0) -> QuantizedLinear:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, out, bias=True)
    torch.nn.init.normal_(lin.weight, std=0.5)
    return QuantizedLinear.from_linear(lin, mode, group)


@pytest.mark.parametrize("mode,group", MODES)
def test_prompt_weight_is_the_dequantized_weight_bit_for_bit(mode, group):
    a, b = layer(mode, group, seed=1), layer(mode, group, seed=2)  # same shape: one shared workspace
    wa = a.prompt_weight().clone()
    wb = b.prompt_weight()
    assert torch.equal(wa, dequantized(a).to(torch.bfloat16))
    assert torch.equal(wb, dequantized(b).to(torch.bfloat16)) and not torch.equal(wa, wb)


@pytest.fixture(autouse=True)
def fast_bf16_gemm(monkeypatch):
    """Every test here runs the prompt GEMM as on a CPU with a fast bfloat16 GEMM (on an AVX2-only CPU it is off:
    test_no_prompt_gemm_without_a_fast_bfloat16_gemm)."""
    monkeypatch.setattr(quantize, "bf16_gemm", lambda: True)


@pytest.mark.parametrize("mode,group", MODES)
def test_no_prompt_gemm_without_a_fast_bfloat16_gemm(mode, group, monkeypatch):
    monkeypatch.setattr(quantize, "bf16_gemm", lambda: False)
    q = layer(mode, group)
    x = torch.randn(quantize.PROMPT_MIN_ROWS[mode] + 3, 64).bfloat16()
    with torch.inference_mode():
        kernel = q(x)
        with prompt.prompt_mode():
            assert torch.equal(q(x), kernel)


@pytest.mark.parametrize("mode,group", MODES)
def test_only_a_prompt_product_of_enough_rows_leaves_the_kernel(mode, group):
    q = layer(mode, group)
    rows = quantize.PROMPT_MIN_ROWS[mode]
    x = torch.randn(rows + 3, 64).bfloat16()
    with torch.inference_mode():
        kernel = q(x)
        assert torch.equal(q(x[:2]), kernel[:2])  # outside prompt mode: the kernel at every size
        with prompt.prompt_mode():
            gemm = q(x)
            short = q(x[: rows - 1])
    want = F.linear(x, dequantized(q).bfloat16()) + q.bias
    assert torch.equal(gemm, want)
    assert torch.equal(short, kernel[: rows - 1])  # below the crossover: still the kernel
    # the same weights either way: the two kernels agree to bfloat16 rounding
    assert torch.allclose(gemm.float(), kernel.float(), rtol=2**-6, atol=2**-6 * kernel.float().abs().max().item())


def test_prompt_mode_ends_with_its_block_even_on_an_error():
    assert not prompt.active()
    with pytest.raises(RuntimeError):
        with prompt.prompt_mode():
            assert prompt.active()
            raise RuntimeError("boom")
    assert not prompt.active()


@pytest.mark.parametrize("mode,group", MODES)
def test_a_prefill_in_prompt_mode_scores_the_prompt_as_the_decode_kernels_do(mode, group, monkeypatch):
    """Prompt mode changes rounding only: its last logits and keys are the decode kernels' to bfloat16 precision, and
    the forward after it runs outside prompt mode (the width-invariant attention and the quantized kernels)."""
    monkeypatch.setitem(quantize.PROMPT_MIN_ROWS, mode, 4)
    target = ModelTarget(quantize_model(tiny_model(7), mode, group))
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0))
    outs, caches = [], []
    for on in (True, False):
        monkeypatch.setattr(prompt, "active", prompt.active if on else (lambda: False))
        cache = target.new_cache(1, 64)
        outs.append(target.prefill(ids, cache).logits.float())
        caches.append(cache)
    fast, slow = outs
    assert not torch.equal(fast, slow)  # another kernel ran
    assert (fast - slow).abs().max() < 0.05 * slow.abs().max()
    k_fast, k_slow = (c.k[:, 0, :, :40].float() for c in caches)  # [layers, H_kv, 40, D]
    assert (k_fast - k_slow).abs().max() < 0.05 * k_slow.abs().max()
    seen = []
    monkeypatch.setattr(prompt, "active", lambda: seen.append(True) or False)
    target.forward(torch.tensor([[3]]), torch.tensor([[40]]), caches[0], None)
    assert seen  # the step asked, and was told it is not a prefill
