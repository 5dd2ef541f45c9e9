"""Decode-time layout of CPU Linear weights (`SPECGEN_WEIGHT_LAYOUT`): `packed` (default where torch has oneDNN,
PackedLinears on the measured plan, tiles only where that is tiled.c at every row count), `col` (column-major, every
product MKL) or `row` (PyTorch's). Values are unchanged; training keeps the default layout.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specgen.devices import is_cpu, module_device
from specgen.errors import UsageError
from specgen.models import packed_linear
from specgen.models.quantize import prepare_kernels

LAYOUTS = ("packed", "col", "row")
ENV = "SPECGEN_WEIGHT_LAYOUT"


def default_layout() -> str:
    """`packed` where this torch build has oneDNN's packed linear, else `col`."""
    return "packed" if packed_linear.available() else "col"


def layout_name() -> str:
    """The layout to use: `SPECGEN_WEIGHT_LAYOUT` (packed | col | row), default `default_layout()`."""
    name = os.environ.get(ENV, "").strip().lower() or default_layout()
    if name not in LAYOUTS:
        raise UsageError(f"{ENV}={name!r}; choose from {', '.join(LAYOUTS)}")
    if name == "packed" and not packed_linear.available():
        raise UsageError(f"{ENV}=packed needs a torch build with oneDNN (mkldnn); use col or row")
    return name


def applies_to(module: nn.Module) -> bool:
    """Whether the CPU layout applies: only to a module whose weights live on the CPU. Column-major storage and the
    oneDNN-packed copies are CPU kernel choices (MKL GEMV vs oneDNN GEMM), measured on this CPU; a model on cuda
    keeps PyTorch's layout and cuBLAS picks its own kernels (fence: `specgen/devices.py`, tests/test_devices.py)."""
    return is_cpu(module_device(module))


@torch.no_grad()
def decode_layout(module: nn.Module, layout: str | None = None) -> nn.Module:
    """Re-store every CPU Linear weight of `module` column-major (in place; ties stay ties) and, for the
    `packed` layout, make each a PackedLinear; returns the module."""
    layout = layout or layout_name()
    prepare_kernels(module)  # int4 layers: their kernel copies now (any layout)
    if layout == "row" or not applies_to(module):
        return module
    for lin in module.modules():
        if isinstance(lin, nn.Linear) and lin.weight.device.type == "cpu" and lin.weight.stride(0) != 1:
            lin.weight.data = lin.weight.data.t().contiguous().t()  # same values, storage [in, out]
    if layout != "packed":
        return module
    packed_linear.pack_linears(module)
    packed_linear.measure_now(module)  # at load, not in the first timed product (threads set later: re-measured lazily)
    packed_linear.hold_tiled(module)  # weights the plan sends to tiled.c at every row count: held as tiles only
    return module


@torch.no_grad()
def before_load(module: nn.Module) -> None:
    """`decode_layout` for a module built but not loaded: its weights made empty in their decode form (column-major,
    or tiles where the plan is known without timing), so the load writes each straight into it, with no second copy.
    `decode_layout` after the load finishes the rest (int4 kernels, a plan that times the loaded weights)."""
    layout = layout_name()
    if layout == "row" or not applies_to(module):
        return
    for lin in module.modules():
        w = lin.weight if isinstance(lin, nn.Linear) else None
        if w is not None and w.device.type == "cpu" and w.stride(0) != 1:
            lin.weight.data = torch.empty_strided(w.shape, (1, w.shape[0]), dtype=w.dtype)  # storage [in, out]
    if layout == "packed":
        packed_linear.pack_linears(module)
        packed_linear.hold_tiled(module, loaded=False)
