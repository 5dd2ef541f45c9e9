"""glue.c's row kernels: near the torch expressions they replace, every row as alone, and used only where they may."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen import native
from specgen.native import ops

pytestmark = pytest.mark.skipif(native.glue() is None, reason="no C compiler: the native kernels are not built here")


def bf16(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def torch_rms_norm(x, w, eps):  # transformer.RMSNorm's torch path
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


@pytest.mark.parametrize("dim", [64, 576, 1000])  # a tail past the 16 lanes at 1000
def test_rms_norm_is_within_a_rounding_of_torch_and_every_row_is_as_alone(dim):
    x, w = bf16(7, dim, scale=3.0), bf16(dim, seed=1)
    got = ops.rms_norm(x, w, 1e-5)
    want = torch_rms_norm(x, w, 1e-5)
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all()
    assert torch.equal(torch.cat([ops.rms_norm(x[i : i + 1], w, 1e-5) for i in range(7)]), got)


def test_the_fused_add_and_norm_is_bitwise_the_add_then_the_norm():
    x, a, w = bf16(2, 3, 576), bf16(2, 3, 576, seed=2), bf16(576, seed=3)
    total, normed = ops.add_rms_norm(x, a, w, 1e-5)
    assert torch.equal(total, x + a) and torch.equal(normed, ops.rms_norm(x + a, w, 1e-5))


def test_silu_mul_is_within_a_rounding_of_torch_on_fused_halves():
    gate_up = bf16(5, 2 * 1536, scale=4.0)
    gate, up = gate_up.split(1536, -1)  # views with the row stride of the fused product
    got = ops.silu_mul(gate, up)
    want = F.silu(gate) * up
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all()
    assert torch.equal(got, ops.silu_mul(gate.contiguous(), up.contiguous()))
    assert torch.equal(got[2:3], ops.silu_mul(gate[2:3], up[2:3]))


def test_they_run_only_on_bfloat16_cpu_tensors_without_a_gradient_to_track():
    x, w = bf16(2, 8), bf16(8)
    assert ops.usable(x, w) and not ops.usable(x.float()) and not ops.usable(x, w.float())
    w.requires_grad_(True)
    assert not ops.usable(x, w)
    with torch.no_grad():
        assert ops.usable(x, w)
