"""qmm.c, the int4 / int8 products over 15-bit activations: near the dequantized product, each row a function of
itself alone at any row and thread count, and the same bits on every instruction set this CPU runs."""

from __future__ import annotations

import ctypes
import platform

import pytest
import torch

from specgen import native
from specgen.models.quantize import QuantizedLinear
from specgen.native import ops
from tests.conftest import dequantized

needs_qmm = pytest.mark.skipif(native.library("qmm") is None, reason="no C compiler: qmm.c is not built here")
CASES = [("int4", 32), ("int4", 64), ("int8", 0)]


def layer(mode: str, group: int, out: int = 100, k: int = 128) -> QuantizedLinear:
    lin = torch.nn.Linear(k, out, bias=False)
    torch.nn.init.normal_(lin.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    return QuantizedLinear.from_linear(lin, mode, group)


def activations(rows: int, k: int = 128) -> torch.Tensor:
    """x [rows, k]: blocks of very different scales, an outlier, an all-zero block (d = 0) and exact ties."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 2, k // 32).repeat_interleave(32)
    x[0, 5] = 400.0
    x[1, 32:64] = 0.0
    x[2, 64:96] = torch.arange(32) - 15.5
    return x


def product(q: QuantizedLinear, x: torch.Tensor, threads: int = 1) -> torch.Tensor:
    codes, sz, bits, group, out = q.kernel()[1]
    return ops.qmm(x, codes, sz, bits, group, out, threads)


@needs_qmm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode,group", CASES)
def test_rows_are_bitwise_alone_and_near_the_dequantized_product(mode, group, dtype):
    q = layer(mode, group)
    assert "codes" in q.kernel()[3]  # qmm.c's copies
    x = activations(19).to(dtype)
    alone = torch.cat([product(q, x[i : i + 1]) for i in range(19)])
    for m in (*range(1, 10), 19):
        assert torch.equal(product(q, x[:m]), alone[:m]), m
    assert torch.equal(product(q, x, threads=2), alone)
    ref = x.double() @ dequantized(q).double().t()
    # the activation grid is max|x| / 32512 per block, then one rounding to x's dtype
    bound = (x.double().abs() @ dequantized(q).double().abs().t()) * 2.0**-14 + ref.abs() * (2.0**-8 if dtype ==
                                                                                             torch.bfloat16 else 1e-6)
    assert ((alone.double() - ref).abs() <= bound).all()


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> list[tuple[str, int, ctypes.CDLL]]:
    """qmm.c built for the plain x86-64 instruction set and, where this CPU runs it, AVX2 (-march=x86-64-v3): (march,
    the path its dispatch reports, the library), compiled once for the module."""
    cc, why = native.compiler()
    if cc is None:
        pytest.skip(why)
    flags = tuple(f for f in native.FLAGS if not f.startswith("-march"))
    avx2 = {"avx2", "fma"} <= set(native.cpu_signature().split())
    out = []
    for march, path in [("-march=x86-64", 0)] + ([("-march=x86-64-v3", 1)] if avx2 else []):
        so = tmp_path_factory.mktemp("qmm") / f"qmm{path}.so"
        assert native.compile_to(cc, "qmm", (*flags, march), so) == ""
        out.append((march, path, ctypes.CDLL(str(so))))
    return out


@needs_qmm
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction sets")
@pytest.mark.parametrize("mode,group", CASES)
def test_every_instruction_set_gives_the_same_bits(mode, group, builds):
    """The AVX2 and plain C builds of qmm.c (the reference form) compute what this CPU's own build does, bit for bit,
    at 1, 2 and 7 rows (the AVX2 loop reads both 8-output halves in one pass up to 2 rows, one at a time past)."""
    q = layer(mode, group)
    codes, sz, bits, group_, out = q.kernel()[1]
    for rows in (1, 2, 7):
        x = activations(7)[:rows].bfloat16()
        want = product(q, x)
        for march, path, lib in builds:
            assert lib.specgen_qmm_path() == path
            got = torch.empty_like(want)
            args = [x.data_ptr(), 2, codes.data_ptr(), sz.data_ptr(), bits, group_, got.data_ptr(), rows, 128, out, 1]
            assert lib.specgen_qmm(*[ctypes.c_void_p(a) if i in (0, 2, 3, 6) else ctypes.c_int(a)
                                     for i, a in enumerate(args)]) == 0
            assert torch.equal(got, want), (march, rows)


def test_widths_off_its_blocks_run_torchs_kernel():
    """qmm.c reads whole blocks of 32 inputs: other widths (an int8 layer 48 wide) take torch's product."""
    q = layer("int8", 0, k=48)
    assert q.kernel()[0] is torch.ops.aten._weight_int8pack_mm


@needs_qmm
def test_a_fake_or_counted_product_goes_through_torch_ops():
    """ops.qmm calls its C kernel as a function, but a fake tensor (FakeTensorMode, make_fx: the GPU kernel counts
    trace CPU models so) takes the op's fake kernel, and an op counter sees the op: no C call on a fake pointer."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    q = layer("int4", 32)
    x = activations(3).bfloat16()
    with torch.inference_mode():
        want = product(q, x)
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            got = product(q, fake.from_tensor(x))
        assert got.shape == (3, 100) and got.dtype == torch.bfloat16
        with Seen() as seen:
            counted = product(q, x)
    assert seen.ops == ["qmm"] and torch.equal(counted, want)
