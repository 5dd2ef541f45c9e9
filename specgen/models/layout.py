"""Decode-time layout of CPU Linear weights, same values (`SPECGEN_WEIGHT_LAYOUT`; training keeps PyTorch's)."""

from __future__ import annotations

import os

import torch
from torch import nn

from specgen.devices import is_cpu, module_device
from specgen.errors import UsageError
from specgen.models import packed_linear, sliced_linear
from specgen.models.quantize import prepare_kernels

LAYOUTS = ("packed", "col", "row")
ENV = "SPECGEN_WEIGHT_LAYOUT"


def layout_name() -> str:
    """`SPECGEN_WEIGHT_LAYOUT`: packed (PackedLinears: tiled.c, oneDNN for a bfloat16 prompt; the default where torch
    has oneDNN's packed linear), col (column-major, every product MKL; the default elsewhere) or row (PyTorch's)."""
    name = os.environ.get(ENV, "").strip().lower() or ("packed" if packed_linear.available() else "col")
    if name not in LAYOUTS:
        raise UsageError(f"{ENV}={name!r}; choose from {', '.join(LAYOUTS)}")
    if name == "packed" and not packed_linear.available():
        raise UsageError(f"{ENV}=packed needs a torch build with oneDNN (mkldnn); use col or row")
    return name


@torch.no_grad()
def decode_layout(module: nn.Module, layout: str | None = None, loaded: bool = True) -> nn.Module:
    """Re-store every CPU Linear weight of `module` column-major (in place; ties stay ties) and, for the `packed`
    layout, make each a PackedLinear; returns the module. Not `loaded` (built, before its load): the weights are made
    empty in their decode form (float32 ones as tiles), so the load writes each once; a second call after the load
    finishes the rest (int4 kernels)."""
    layout = layout or layout_name()
    if loaded:
        prepare_kernels(module)  # int4 layers: their kernel copies now (any layout)
    # CPU kernel choices only: on cuda cuBLAS picks its own (fence: `specgen/devices.py`, tests/test_devices.py), over
    # one GEMM shape (row-invariant products)
    if not is_cpu(module_device(module)):
        return sliced_linear.row_invariant(module)
    if layout == "row":
        return module
    for lin in module.modules():
        w = lin.weight if isinstance(lin, nn.Linear) else None
        if w is not None and w.device.type == "cpu" and w.stride(0) != 1:
            col = torch.empty_strided(w.shape, (1, w.shape[0]), dtype=w.dtype)  # storage [in, out]
            lin.weight.data = col.copy_(w.data) if loaded else col  # same values (none yet before the load)
    if layout == "packed":
        packed_linear.pack_linears(module)
        packed_linear.hold_tiled(module, loaded)  # float32 weights: tiles only (tiled.c runs their every product)
    return module
