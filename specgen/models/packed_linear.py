"""PackedLinear: an nn.Linear whose multi-row products run on a oneDNN-packed copy of its weight (CPU decoding).

Why: on this project's CPU (AMD EPYC with AVX-512, torch 2.13) MKL's `F.linear` on a few rows costs
about one single-row product *per row* for the small, cache-resident matrices of a decoder: a verify
forward over n tokens then costs nearly n times the weight work of an AR step, which is most of the
c(n) that makes speculative and Jacobi decoding lose on a CPU. oneDNN's GEMM over a weight packed once
for it (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU backend uses) reuses the
weight across rows. One core, microseconds per product (`recipes/tiny/logs/packed-linear.log`):

    256 x 768 (mesh wqkv)      1 row:  MKL col-major 9.9, oneDNN 19.1 | 5 rows: 43.8 vs 21.2
    256 x 5121 (BPT LM head)   1 row:  75.2 vs 62.6                     | 5 rows: 356.4 vs 71.7
    576 x 1536 (SmolLM2 w1)    1 row:  45.6 vs 45.9 | 4 rows: 186.5 vs 48.4 | 16 rows: 361.6 vs 128.6
    576 x 49152 (SmolLM2 head) 1 row:  4,042 vs 3,628 | 16 rows: 17,522 vs 5,850

Whole decoders, one core, ms per cached forward over n new tokens (`python -m specgen.models.layout`):
SmolLM2-135M streams its 0.5 GB of weights from memory every forward, and there oneDNN is faster even for
one row (22.8 vs 27.5 ms); the tiny image and mesh GPTs live in the cache, where MKL's GEMV stays faster
for up to three rows (mesh: 1.18 vs 1.44 ms for one token, 1.54 vs 1.61 for two; 2.54 vs 1.90 for five).
So `pack_linears` picks the smallest row count sent to oneDNN per model: 1 for a model whose Linear
weights exceed `STREAMED_BYTES` (twice this CPU's 32 MB last-level cache), else `SMALL_MODEL_MIN_ROWS`.
AR baselines therefore keep their fastest kernel and every multi-token forward (verification, Jacobi
blocks, prefill) gets its own; outputs agree to float32 rounding (the two kernels sum in different
orders, as MKL's own GEMV and GEMM already did).

The packed copy is made on first use and remade whenever the weight changes (a LoRA merge, `.data`
replaced, a dtype change): it is keyed by the weight's storage pointer, version counter and dtype (a
weight made under `torch.inference_mode` has no version counter: only a new storage or dtype repacks it). It
is never saved (not a parameter or buffer) and is dropped by deepcopy/pickle. Products that need
gradients, other devices or dtypes fall back to `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: A model whose Linear weights exceed this streams them from memory each forward: oneDNN for every product.
STREAMED_BYTES = 64 * 2**20
#: Otherwise products of at least this many rows use the packed weight (fewer: MKL's GEMV; at 3 rows the
#: two measured alike on the mesh GPT, 1.45-1.83 vs 1.62-1.77 ms, at 4 oneDNN won, 2.25 vs 1.76 ms).
SMALL_MODEL_MIN_ROWS = 4
#: The row count oneDNN tunes the packed layout for (2 .. 64 measured alike for 2 .. 16 rows; 1 is slower).
PACK_HINT = 16
PACKABLE = (torch.float32, torch.bfloat16)


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) that sends products of >= `min_rows` rows to oneDNN."""

    min_rows: int = SMALL_MODEL_MIN_ROWS
    _packed: tuple | None = None  # (key, packed weight); key = (storage pointer, version, dtype) of `weight`

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        w = self.weight
        if (x.numel() < self.min_rows * self.in_features or x.dtype != w.dtype or w.dtype not in PACKABLE
                or x.device.type != "cpu" or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return F.linear(x, w, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, "none", [], "")

    def packed_weight(self) -> torch.Tensor:
        """The oneDNN-packed copy of `weight` (opaque tensor), remade when the weight changed."""
        w = self.weight
        key = (w.data_ptr(), None if w.is_inference() else w._version, w.dtype)  # inference tensors have no version
        if self._packed is None or self._packed[0] != key:
            with torch.no_grad():
                self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT))
        return self._packed[1]

    def __getstate__(self) -> dict:
        """deepcopy / pickle without the packed copy (an opaque tensor has no storage); it is remade on use."""
        state = dict(self.__dict__)
        state.pop("_packed", None)
        return state


def min_rows_for(module: nn.Module) -> int:
    """Smallest product sent to oneDNN in `module`: 1 when its Linear weights are streamed from memory."""
    weights = {id(m.weight): m.weight for m in module.modules() if isinstance(m, nn.Linear)}  # ties once
    size = sum(w.numel() * w.element_size() for w in weights.values())
    return 1 if size > STREAMED_BYTES else SMALL_MODEL_MIN_ROWS


def pack_linears(module: nn.Module, min_rows: int | None = None) -> nn.Module:
    """Turn every CPU nn.Linear of `module` into a PackedLinear in place (parameters, ties and names unchanged)."""
    rows = min_rows or min_rows_for(module)
    for lin in module.modules():
        if type(lin) in (nn.Linear, PackedLinear) and lin.weight.device.type == "cpu":
            lin.__class__ = PackedLinear
            lin.min_rows = rows
    return module
