"""row_invariant: an elementwise op's bits per row do not depend on the rows beside it, at any thread count."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from specgen.models.elementwise import LANES, row_invariant

OPS = {"silu": F.silu, "sigmoid": torch.sigmoid, "gelu_tanh": partial(F.gelu, approximate="tanh"), "exp": torch.exp,
       "tanh": torch.tanh}
ROWS = (1, 2, 5, 7, 8, 13, 16, 17, 19, 20, 27, 40)  # 4864-wide: several rows split unevenly at 3, 4 and 6 threads


@pytest.fixture
def threads():
    """Sets torch's threads for one test (more than this machine's cores is fine: the split is what is tested)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def rows_alone(fn, x: torch.Tensor) -> torch.Tensor:
    """fn of each row of x alone, stacked: what AR steps compute."""
    return torch.cat([fn(x[i : i + 1]) for i in range(len(x))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n_threads", [1, 2, 3, 6])
@pytest.mark.parametrize("width", [4864, 1])  # Qwen2.5-0.5B's feed-forward; Qwen2-MoE's shared expert gate
def test_each_row_gets_its_bits_alone_at_every_row_count_and_thread_count(threads, dtype, op, n_threads, width):
    threads(n_threads)
    x = (torch.randn(max(ROWS), width, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    fn = partial(row_invariant, OPS[op])
    alone = rows_alone(fn, x)
    if width % LANES == 0:  # a row of whole vectors alone: the op's own bits (AR steps unchanged)
        assert torch.equal(alone, rows_alone(OPS[op], x))
    for t in ROWS:
        assert torch.equal(fn(x[:t]), alone[:t]), t
    gate, _ = torch.cat([x, x], -1)[:17].split(width, -1)  # a split's view (quantize's gate): not contiguous
    assert torch.equal(fn(gate), alone[:17])


@pytest.mark.parametrize("op,n_threads,width", [("silu", 3, 4864), ("sigmoid", 1, 1)])
def test_the_control_a_plain_float32_op_gives_rows_other_bits_as_the_row_count_moves(threads, op, n_threads, width):
    """What row_invariant is for, on this torch (a record: the test above is one that can fail): at 3 threads a wide
    activation's thread shares end mid-vector, and a [T, 1] gate's last partial vector takes the scalar path."""
    threads(n_threads)
    x = torch.randn(200 // width + 40, width, generator=torch.Generator().manual_seed(0)) * 3
    alone = rows_alone(OPS[op], x)
    assert any(not torch.equal(OPS[op](x[:t]), alone[:t]) for t in range(1, len(x) + 1))


def test_any_shape_keeps_its_shape_and_values_and_the_thread_count_is_restored(threads):
    threads(3)
    x = torch.randn(3, 16389)  # odd width: padded
    y = row_invariant(F.silu, x)
    assert y.shape == x.shape and torch.allclose(y, F.silu(x)) and torch.get_num_threads() == 3
    assert row_invariant(torch.exp, torch.empty(0, 8)).shape == (0, 8)
