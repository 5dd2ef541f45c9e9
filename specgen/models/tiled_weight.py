"""TiledWeight: a float32 Linear weight [N, K] held only as tiled.c's tiles, so a decoder keeps its weights once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map

from specgen.native import ops

aten = torch.ops.aten


class TiledWeight(torch.Tensor):
    """A weight [N, K] whose only storage is `tiles` [ceil(N / T), K, T] (`ops.tile`'s layout); column-major
    strides, as `models/layout.py` stores a dense decode weight. Ops other than a lookup, detach or alias read a dense
    copy made for them (an in-place op writes back into the tiles): exact values everywhere."""

    tiles: torch.Tensor

    @staticmethod
    def __new__(cls, tiles: torch.Tensor, n: int) -> TiledWeight:
        return torch.Tensor._make_wrapper_subclass(cls, (n, tiles.shape[1]), strides=(1, n), dtype=tiles.dtype,
                                                   device=tiles.device)

    def __init__(self, tiles: torch.Tensor, n: int) -> None:
        self.tiles = tiles

    @classmethod
    def of(cls, weight: torch.Tensor, copy: bool = True) -> nn.Parameter:
        """A parameter holding `weight`'s values (`copy`; else unset, for a load to write) as tiles only."""
        n, k = weight.shape
        held = cls(ops.empty_tiles(n, k, weight.dtype, weight.device), n)
        if copy:
            ops.fill_tiles(held.tiles, weight.detach())
        return nn.Parameter(held, weight.requires_grad)

    def dense(self) -> torch.Tensor:
        """A new column-major [N, K] copy of the values."""
        count, k, width = self.tiles.shape
        return self.tiles.permute(1, 0, 2).reshape(k, count * width)[:, : self.shape[0]].contiguous().t()

    @property
    def data(self) -> torch.Tensor:
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        """`nn.Module.to(dtype)` sets each weight's `.data` to its converted copy: the tiles must follow, else the
        dense copies every other op reads keep the old dtype."""
        self.tiles = ops.fill_tiles(ops.empty_tiles(*value.shape, value.dtype, value.device), value)
        torch.Tensor.data.__set__(self, value)

    def data_ptr(self) -> int:
        return self.tiles.data_ptr()

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"TiledWeight({tuple(self.shape)}, {self.dtype})"

    def __deepcopy__(self, memo: dict) -> nn.Parameter:
        """A dense parameter: a copied layer (a bfloat16 draft head) is converted and stored as its own."""
        memo[id(self)] = copy = nn.Parameter(self.dense(), self.requires_grad)
        return copy

    def __reduce_ex__(self, protocol):
        return nn.Parameter(self.dense(), self.requires_grad).__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """The calls a load and a decode make (detach, copy_, embedding), answered on the tiles here: torch's first
        Python dispatch on a subclass imports torch.distributed.tensor (seconds of start-up); the rest dispatches."""
        if func is torch.Tensor.detach:
            return cls(args[0].tiles, args[0].shape[0])
        if func is torch.Tensor.copy_ and isinstance(args[0], TiledWeight) and not isinstance(args[1], TiledWeight):
            ops.fill_tiles(args[0].tiles, args[1])  # a load writing the weight: straight into the tiles
            return args[0]
        if func is F.embedding and isinstance(args[1], TiledWeight):  # a tied embedding's lookup, [..., K]
            return rows(args[1], args[0])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):  # torch's own calls, below the torch-function level
            return cls(args[0].tiles, args[0].shape[0])
        if func is aten.embedding.default:
            return rows(args[0], args[1])
        dense = {}  # id -> (a TiledWeight argument, its dense copy): one copy per weight, however often passed

        def unwrap(a):
            return dense.setdefault(id(a), (a, a.dense()))[1] if isinstance(a, TiledWeight) else a

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func._schema.is_mutable:  # write back what the op changed; it returns the weight itself, not the copy
            for a, d in dense.values():
                ops.fill_tiles(a.tiles, d)
            back = {id(d): a for a, d in dense.values()}
            return tree_map(lambda o: back.get(id(o), o), out)
        return out


def rows(w: TiledWeight, idx: torch.Tensor) -> torch.Tensor:
    """Rows `idx` [...] of w [N, K] gathered from its tiles: [..., K]."""
    width = w.tiles.shape[2]
    return w.tiles[idx // width, :, idx % width]
