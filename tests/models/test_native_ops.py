"""glue.c's row kernels (bfloat16, float32): near the torch expressions they replace, every row as alone, and used
only where they may."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen.models.kernel_choice import native_norms
from specgen.native import ops
from tests.conftest import needs_tiled

pytestmark = needs_tiled


def bf16(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def torch_rms_norm(x, w, eps):  # transformer.RMSNorm's torch path
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


TOLERANCE = {torch.bfloat16: 2**-7, torch.float32: 2**-20}  # one rounding of the dtype (float32: a few ulps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim", [64, 576, 1000])  # a tail past the 16 lanes at 1000
def test_rms_norm_is_within_a_rounding_of_torch_and_every_row_is_as_alone(dim, dtype):
    x, w = bf16(7, dim, scale=3.0).to(dtype), bf16(dim, seed=1).to(dtype)
    got = ops.rms_norm(x, w, 1e-5)
    want = torch_rms_norm(x, w, 1e-5)
    assert got.dtype == dtype
    assert ((got.float() - want.float()).abs() <= want.float().abs() * TOLERANCE[dtype] + 1e-30).all()
    assert torch.equal(torch.cat([ops.rms_norm(x[i : i + 1], w, 1e-5) for i in range(7)]), got)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_add_and_norm_is_bitwise_the_add_then_the_norm(dtype):
    x, a, w = (t.to(dtype) for t in (bf16(2, 3, 576), bf16(2, 3, 576, seed=2), bf16(576, seed=3)))
    total, normed = ops.add_rms_norm(x, a, w, 1e-5)
    assert torch.equal(total, x + a) and torch.equal(normed, ops.rms_norm(x + a, w, 1e-5))


def test_models_take_them_on_bfloat16_and_float32_cpu_tensors_with_grad_mode_off():
    x, w = bf16(2, 8), bf16(8)
    with torch.inference_mode():
        assert native_norms(x, w) and native_norms(x.float(), w.float()) and not native_norms(x.half())
        assert not native_norms(x, w.float())  # one dtype
    assert not native_norms(x, w)  # grad mode on: no backward here
