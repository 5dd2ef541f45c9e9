"""Row-invariant products on a GPU: every product runs as GEMMs of one fixed shape (docs/precision.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.models import kernel_choice, prompt

SLICE_ROWS = 64  # every product's rows are cut into zero-padded slices of this many: one GEMM shape at any row count
# a prompt prefill's products (prompt mode) in slices of their own: a prompt runs once per sequence, alike in every
# method, so its bits need only be the same eager and captured; a captured prompt chunk holds this many nodes
# (graphs.PROMPT_NODES), one GEMM a product where 64-row slices ran four and joined them
PROMPT_SLICE_ROWS = 256


class SlicedLinear(nn.Linear):
    """An nn.Linear whose product runs as GEMMs of exactly SLICE_ROWS rows. A GPU library picks its kernel, and with it
    the order of each row's sums, by the GEMM's shape, so one row scored alone (an AR step) and the same row inside a
    verify or a batch could differ in the last bits (a bfloat16 target keeps them; a float32 one rarely moves an argmax
    by them, but may); one shape for every call keeps a row's bits whatever else the forward holds (the products' half
    of the query-count invariance; the attention's: models/attention.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        m, size = rows.shape[0], PROMPT_SLICE_ROWS if prompt.active() else SLICE_ROWS
        if m % size:  # [M', in], M' a multiple of the slice: one copy (F.pad would add a fill kernel per
            padded = rows.new_empty(m + -m % size, rows.shape[1])  # product); the padding rows stay unwritten:
            padded[:m].copy_(rows)  # a GEMM's output row reads only its own input row, so whatever they hold never
            rows = padded  # reaches a real row's bits
        parts = [F.linear(part, self.weight, self.bias) for part in rows.split(size)]  # one launch a slice
        out = parts[0] if len(parts) == 1 else torch.cat(parts)  # [M', out]
        return out[:m].reshape(*x.shape[:-1], out.shape[-1])


def row_invariant(module: nn.Module) -> nn.Module:
    """Make each nn.Linear of `module` that `kernel_choice.sliced_products` slices a SlicedLinear, in place."""
    for lin in module.modules():
        if type(lin) is nn.Linear and kernel_choice.sliced_products(lin.weight):
            lin.__class__ = SlicedLinear
    return module
