"""Row-invariant products (models/sliced_linear.py): one GEMM shape at any row count, applied off the CPU only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specgen.models.layout import decode_layout
from specgen.models import prompt
from specgen.models.sliced_linear import PROMPT_SLICE_ROWS, SLICE_ROWS, SlicedLinear, row_invariant


LINEAR = F.linear


def shape_dependent(x, w, b=None):
    """A GEMM whose sums depend on how many rows it holds, as a GPU library's kernel choice can make them."""
    return LINEAR(x, w, b) + x.numel() // x.shape[-1] / 64  # + rows / 64


def rows_alone_and_together(lin: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row of x [M, in] scored alone, all M scored in one call), both [M, out]."""
    with torch.inference_mode():
        return torch.cat([lin(x[j: j + 1]) for j in range(x.shape[0])]), lin(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # a GPU slices both (kernel_choice.SLICED_DTYPES)
@pytest.mark.parametrize("rows", [1, 5, SLICE_ROWS, SLICE_ROWS + 1, 2 * SLICE_ROWS + 3])
def test_a_row_gets_the_same_bits_at_any_row_count(rows, dtype, monkeypatch):
    torch.manual_seed(rows)
    lin = nn.Linear(96, 40, bias=True).to(dtype)
    x = torch.randn(rows, 96, dtype=dtype)
    monkeypatch.setattr(F, "linear", shape_dependent)  # nn.Linear's and SlicedLinear's kernel
    plain = rows_alone_and_together(lin, x)
    lin.__class__ = SlicedLinear
    alone, together = rows_alone_and_together(lin, x)
    assert torch.equal(alone, together)
    assert rows == 1 or not torch.equal(*plain)  # the control: the same kernel unsliced moves with the row count


@pytest.mark.parametrize("rows", [1, SLICE_ROWS + 1, PROMPT_SLICE_ROWS + 3])
def test_a_prompt_runs_its_products_in_slices_of_its_own_each_row_at_one_shape(rows, monkeypatch):
    """In prompt mode (a prefill) a product's rows go in PROMPT_SLICE_ROWS-row slices: a row's bits the same at any row
    count (an eager prompt against its captured chunks), and not a decode step's (the control: their slice differs)."""
    torch.manual_seed(rows)
    lin = nn.Linear(96, 40, bias=True).to(torch.bfloat16)
    lin.__class__ = SlicedLinear
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    monkeypatch.setattr(F, "linear", shape_dependent)
    step = rows_alone_and_together(lin, x)[1]
    with prompt.prompt_mode():
        alone, together = rows_alone_and_together(lin, x)
    assert torch.equal(alone, together)
    assert not torch.equal(together, step)


def test_a_sliced_product_keeps_leading_dims_and_the_plain_values():
    torch.manual_seed(0)
    lin = nn.Linear(32, 24, bias=False)
    x = torch.randn(3, 50, 32)  # 150 rows: three slices, the last padded
    want = lin(x)
    lin.__class__ = SlicedLinear
    got = lin(x)
    assert got.shape == (3, 50, 24)
    torch.testing.assert_close(got, want)


def test_only_linears_off_the_cpu_are_sliced():
    """"meta" stands in for a GPU, where every float dtype's products are sliced (float32's too: cuBLAS picks its
    kernel by the row count); CPU products keep their kernels, and a tied weight stays tied."""
    for device, dtype, sliced in (("meta", torch.bfloat16, True), ("meta", torch.float16, True),
                                  ("meta", torch.float32, True), ("cpu", torch.bfloat16, False),
                                  ("cpu", torch.float32, False)):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Embedding(4, 8)).to(device, dtype)
        model[1].weight = model[0].weight
        m = row_invariant(model)
        assert [type(lin) for lin in m] == [SlicedLinear if sliced else nn.Linear] * 2 + [nn.Embedding], (device, dtype)
        assert m[0].weight is m[1].weight


def test_the_decode_layout_slices_a_low_precision_model_off_the_cpu():
    from tests.conftest import tiny_model

    model = decode_layout(tiny_model(0).to("meta", torch.bfloat16))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is SlicedLinear for m in linears)


def test_whatever_the_padding_rows_hold_never_reaches_a_real_row(monkeypatch):
    """The padding rows are left unwritten (no fill kernel): NaN there changes no real row's bits."""
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=True).to(torch.bfloat16)
    lin.__class__ = SlicedLinear
    x = torch.randn(5, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        clean = lin(x)
        monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *shape: torch.full(shape, float("nan"), dtype=t.dtype))
        assert torch.equal(lin(x), clean)
