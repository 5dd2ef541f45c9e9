"""PackedLinear: an nn.Linear whose CPU products run tiled.c or, on AMX, oneDNN in fixed slices (a row's bits whatever
its batch), or, for a bfloat16 prompt prefill, oneDNN over a packed copy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen import native
from specgen.limits import available_memory
from specgen.models.kernel_choice import AMX_SLICE_ROWS, TILED_DTYPES, amx_slices, cpu_packable, tiled_products
from specgen.models.tiled_weight import TiledWeight
from specgen.native import ops

#: A bfloat16 model is given its copies (oneDNN's packed one for prompts and float32 tiles for decode steps: three
#: times its bytes) only while they and its weights stay within half of RAM; a float32 one needs none (held as tiles).
MAX_MEMORY_SHARE = 1 / 8
#: The row count oneDNN tunes the packed layout for (2 .. 64 measured alike for 2 .. 16 rows; 1 is slower).
PACK_HINT = 16


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose CPU products run native/tiled.c over a tiled copy (float32 at
    every row count, bfloat16 outside a prompt prefill: `kernel_choice.tiled_products`), bfloat16 decode products on
    AMX oneDNN over a packed copy in AMX_SLICE_ROWS-row slices (`kernel_choice.amx_slices`), other products oneDNN
    over that copy where this CPU packs the weight, else torch's `F.linear`."""

    _packed: tuple | None = None  # (key, packed weight); key = (storage pointer, version, dtype) of `weight`
    _tiled: tuple | None = None  # (key, (tiles, padded bias)) for native/tiled.c, keyed as `_packed`
    _paired: tuple | None = None  # ((key, threads), whether a two-slice call gives each slice's bits): `paired`

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        w = self.weight
        if amx_slices(x, w):
            return self.sliced(x)
        if tiled_products(x, w):
            return self.tiled(x, torch.get_num_threads())
        if (x.device.type == "cpu" and x.dtype == w.dtype and cpu_packable(w)
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return onednn(x, self.packed_weight(), self.bias)
        return F.linear(x, w, self.bias)

    def tiled(self, x: torch.Tensor, threads: int) -> torch.Tensor:  # x [..., in] -> [..., out]
        """The product on tiled.c over the float32 tiles (bfloat16: each sum rounded once to bfloat16)."""
        if x.dtype == torch.float32:  # no conversion calls: each `to` is an op a step makes (gpu_sync_count counts it)
            return ops.tiled_linear(x, *self.tiled_weight(), self.out_features, threads)
        return ops.tiled_linear(x.float(), *self.tiled_weight(), self.out_features, threads).to(x.dtype)

    def sliced(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        """oneDNN's product over GEMMs of AMX_SLICE_ROWS rows, or of two slices where `paired`: a row's bits depend on
        its own input only."""
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        m, size = rows.shape[0], AMX_SLICE_ROWS
        if m > size and self.paired():  # 17+ rows: calls of two slices, each streaming the weights once
            size *= 2
        if m % size:  # [M', in], M' a multiple of the call's rows, zero rows added; a GEMM's output row reads only
            rows = F.pad(rows, (0, 0, 0, -m % size))  # its own input row, so they never reach a real row's bits
        w = self.packed_weight()
        if rows.shape[0] == size:  # an AR step, a chain: one call
            out = onednn(rows, w, self.bias)  # [M', out]
        else:
            out = torch.cat([onednn(part, w, self.bias) for part in rows.split(size)])
        return out[:m].reshape(*x.shape[:-1], out.shape[-1])

    def paired(self) -> bool:
        """Whether oneDNN's call over two slices gives every row the bits of its own slice's call, for this weight at
        this thread count: checked bitwise on random rows once per weight and thread count (its kernel, and so each
        row's order of sums, is chosen by the shapes, not the values; SmolLM2's shapes pass at 1 and 2 threads, 48
        rows and more do not: docs/results/text.md). One pass over the weights then serves 17-32 rows, not two."""
        key = (self.weight_key(), torch.get_num_threads())
        if self._paired is None or self._paired[0] != key:
            w, size = self.packed_weight(), AMX_SLICE_ROWS
            rows = torch.randn(2 * size, self.in_features, generator=torch.Generator().manual_seed(0))
            rows = rows.to(self._parameters["weight"].dtype)  # [2 slices, in]
            both = onednn(rows, w, self.bias)
            each = [onednn(part, w, self.bias) for part in rows.split(size)]
            self._paired = (key, torch.equal(both, torch.cat(each)))
        return self._paired[1]

    def packed_weight(self) -> torch.Tensor:
        """The oneDNN-packed copy of `weight` (opaque tensor), remade when the weight changed."""
        key = self.weight_key()
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_HINT))
        return self._packed[1]

    def tiled_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tiles, padded bias) of `weight` for native/tiled.c, float32 (a bfloat16 weight's values exactly), remade
        when the weight changed."""
        key = self.weight_key()
        if self._tiled is None or self._tiled[0] != key:
            w, b = self.weight, None if self.bias is None else self.bias.detach().float()
            if isinstance(w, TiledWeight):  # the tiles are the weight (a float32 copy of a converted model's)
                tiles = w.tiles.float()
                self._tiled = (key, (tiles, ops.padded_bias(b, tiles)))
            else:  # bfloat16: float32 tiles, its values exactly
                self._tiled = (key, ops.tile(w.detach().float(), b))
        return self._tiled[1]

    def weight_key(self) -> tuple:
        """What a copy of `weight` is valid for: its storage, version counter and dtype (an inference tensor has no
        version counter: only a new storage or dtype remakes its copies)."""
        w = self.weight.tiles if type(self.weight) is TiledWeight else self.weight
        return w.data_ptr(), None if w.is_inference() else w._version, w.dtype

    def __getstate__(self) -> dict:
        """deepcopy / pickle without the packed and tiled copies (an opaque tensor has no storage) and the `paired`
        verdict, all keyed by the original's storage; remade on use."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_packed", "_tiled", "_paired")}


def onednn(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product of x [..., in] with a packed weight (`PackedLinear.packed_weight`): [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_linears(module: nn.Module) -> nn.Module:
    """Turn every CPU float32 / bfloat16 nn.Linear of `module` into a PackedLinear in place (parameters, ties and names
    unchanged); a bfloat16 model past MAX_MEMORY_SHARE of RAM keeps its nn.Linears (torch's product, whose rows are
    not invariant: docs/precision.md)."""
    linears = [lin for lin in module.modules()
               if type(lin) in (nn.Linear, PackedLinear) and lin.weight.device.type == "cpu"
               and lin.weight.dtype in TILED_DTYPES]
    halves = {id(lin.weight): lin.weight for lin in linears if lin.weight.dtype == torch.bfloat16}.values()
    size, ram = sum(w.numel() * w.element_size() for w in halves), available_memory()  # a tied weight once
    if ram and size > MAX_MEMORY_SHARE * ram:
        linears = [lin for lin in linears if lin.weight.dtype == torch.float32]
    for lin in linears:
        lin.__class__ = PackedLinear
    return module


def hold_tiled(module: nn.Module, loaded: bool = True) -> None:
    """Hold each float32 PackedLinear weight as its tiles only (a `TiledWeight`; ties stay ties), one weight at a time:
    tiled.c runs its every product, so the model keeps its weights once. Not `loaded`: tiles left for the load to
    write."""
    if native.library("tiled") is None:
        return
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            holders.setdefault(id(p), []).append((m, name))
    for lin in [m for m in module.modules() if isinstance(m, PackedLinear)]:
        w = lin.weight
        if isinstance(w, TiledWeight) or w.dtype != torch.float32:
            continue
        tiled = TiledWeight.of(w, copy=loaded)
        for m, name in holders.pop(id(w)):
            m._parameters[name] = tiled
        lin._tiled = lin._packed = None
