"""PackedLinear: an nn.Linear whose CPU decode steps run tiled.c, and whose prompt prefills its model's plan's kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen import native
from specgen.limits import available_memory
from specgen.models.kernel_choice import (STEP_DTYPES, KernelChoice, Plan, cpu_packable, inference_on_cpu,
                                          pinned_min_rows, step_products, tiled_products)
from specgen.models.tiled_weight import TiledWeight
from specgen.native import ops

#: A model whose linear weights exceed this share of the machine's RAM gets no copies: the weights and their two
#: copies (oneDNN's and tiled.c's, both alive while the kernels are measured) then stay within half of it.
MAX_MEMORY_SHARE = 1 / 6
#: A large model's plan: tiled.c for every product, prompts too (its weights held once, as tiles).
TILES_ONLY = Plan(min_rows=1 << 30, native=(1, None))
#: The row count oneDNN tunes the packed layout for (2 .. 64 measured alike for 2 .. 16 rows; 1 is slower).
PACK_HINT = 16


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose CPU decode products run native/tiled.c (tiled copy) at every
    row count, and whose prompt prefills take the kernel its model's plan names for their row count: MKL, oneDNN
    (packed copy) or tiled.c."""

    _choice: KernelChoice  # shared by the model's PackedLinears (pack_linears, the only maker of one, sets it)
    _packed: tuple | None = None  # (key, packed weight); key = (storage pointer, version, dtype) of `weight`
    _tiled: tuple | None = None  # (key, (tiles, padded bias)) for native/tiled.c, keyed as `_packed`

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        w = self.weight
        if type(w) is TiledWeight and inference_on_cpu((torch.float32,), x):  # held as tiles only for tiled.c
            return ops.tiled_linear(x, *self.tiled_weight(), self.out_features, torch.get_num_threads())
        if step_products(x, w):  # a decode step: tiled.c at every row count (bfloat16: over float32 tiles)
            out = ops.tiled_linear(x.float(), *self.tiled_weight(), self.out_features, torch.get_num_threads())
            return out.to(x.dtype)  # float32: itself; bfloat16: each sum rounded once
        # CPU only: the device and dtype are checked before the plan, whose first read measures the kernels on
        # this CPU (a model moved to a GPU after packing must never run, or measure, oneDNN's CPU kernels)
        if (x.device.type != "cpu" or x.dtype != w.dtype or not cpu_packable(w)
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return F.linear(x, w, self.bias)
        plan = self._choice.plan()
        rows = x.numel() // self.in_features
        if plan.kernel(rows) == "native" and tiled_products(x, w):  # a plan shared with a bfloat16 copy: not it
            return ops.tiled_linear(x, *self.tiled_weight(), self.out_features, torch.get_num_threads())
        if rows < plan.min_rows:
            return F.linear(x, w, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, "none", [], "")

    def packed_weight(self) -> torch.Tensor:
        """The oneDNN-packed copy of `weight` (opaque tensor), remade when the weight changed."""
        key = self.weight_key()
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_HINT))
        return self._packed[1]

    def tiled_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tiles, padded bias) of `weight` for native/tiled.c, float32 (a bfloat16 weight's values exactly), remade when
    the weight changed."""
        key = self.weight_key()
        if self._tiled is None or self._tiled[0] != key:
            w, b = self.weight, self.bias
            held = isinstance(w, TiledWeight)  # the tiles are the weight: only the bias is padded
            if not held and w.dtype != torch.float32:  # bfloat16: float32 tiles (exact), as tiled.c computes
                w, b = w.detach().float(), None if b is None else b.detach().float()
            copies = (w.tiles, ops.padded_bias(b, w.tiles)) if held else ops.tile(w.detach(), b)
            self._tiled = (key, copies)
        return self._tiled[1]

    def weight_key(self) -> tuple:
        """What a copy of `weight` is valid for: its storage, version counter and dtype (an inference tensor has no
        version counter: only a new storage or dtype remakes its copies)."""
        w = self.weight.tiles if type(self.weight) is TiledWeight else self.weight
        return w.data_ptr(), None if w.is_inference() else w._version, w.dtype

    def __getstate__(self) -> dict:
        """deepcopy / pickle without the packed and tiled copies (an opaque tensor has no storage); remade on use."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_packed", "_tiled")}


def pack_linears(module: nn.Module) -> nn.Module:
    """Turn every CPU float32 / bfloat16 nn.Linear of `module` into a PackedLinear in place (parameters, ties and names
    unchanged), all sharing one KernelChoice (`SPECGEN_PACKED_MIN_ROWS`, else measured). Above MAX_MEMORY_SHARE no
    copy is made: float32 weights are held as tiles only (every product on tiled.c), bfloat16 ones stay nn.Linears
    (torch's product, whose rows are not invariant: docs/precision.md)."""
    linears = [lin for lin in module.modules()
               if type(lin) in (nn.Linear, PackedLinear) and lin.weight.device.type == "cpu"
               and lin.weight.dtype in STEP_DTYPES]
    weights = {id(lin.weight): lin.weight for lin in linears}.values()  # a tied weight once
    size, ram = sum(w.numel() * w.element_size() for w in weights), available_memory()
    large = bool(ram and size > MAX_MEMORY_SHARE * ram)
    if large:
        linears = [lin for lin in linears if lin.weight.dtype == torch.float32]
    if not linears:
        return module
    pinned = pinned_min_rows()
    choice = KernelChoice(linears, TILES_ONLY if large else None if pinned is None else Plan(pinned))
    for lin in linears:
        lin.__class__ = PackedLinear
        lin._choice = choice
    return module


def hold_tiled(module: nn.Module, loaded: bool = True) -> None:
    """Read the shared plan now (not in the first timed product); hold each float32 weight it sends to tiled.c at
    every row count as its tiles only (a `TiledWeight`; ties stay ties), one weight at a time. Not `loaded`: tiles
    left for the load to write, and a plan that needs timing left for the call after the load."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            holders.setdefault(id(p), []).append((m, name))
    for lin in list(module.modules()):
        if not isinstance(lin, PackedLinear) or not (loaded or lin._choice.known()):
            continue
        w = lin.weight
        if (lin._choice.plan().uses_onednn or isinstance(w, TiledWeight) or w.dtype != torch.float32
                or native.library("tiled") is None):
            continue
        tiled = TiledWeight.of(w, copy=loaded)
        for m, name in holders.pop(id(w)):
            m._parameters[name] = tiled
        lin._tiled = lin._packed = None
