"""Load-time LoRA merges: a saved adapter folded into a plain model's weights (training the adapters: train/lora.py)."""

from __future__ import annotations

import math

import torch
from torch import nn

from specgen.errors import UsageError
from specgen.registry import finite


def merge_lora_state(model: nn.Module, state: dict[str, torch.Tensor], rank: int, alpha: float) -> int:
    """Load-time merge of a saved adapter into a plain model: W += (alpha/rank) B @ A. Returns layers merged."""
    paths = sorted({k.rsplit(".", 1)[0] for k in state})
    scale = alpha / rank
    for path in paths:
        try:
            layer = model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"adapter layer {path} is not in the model") from None
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"adapter layer {path} does not fit the model's weight")
        # the adapter is read on the host; the model may already be on its device
        a, b = (state[f"{path}.lora_{n}"].to(layer.weight.device, torch.float32) for n in "AB")
        if tuple(layer.weight.shape) != (b.shape[0], a.shape[1]):
            raise ValueError(f"adapter layer {path} does not fit the model's weight")
        merged = layer.weight.detach() + (b @ a * scale).to(layer.weight.dtype)
        if not finite(merged):  # a NaN or infinite factor, or finite ones overflowing (the product, a float16 sum);
            # the base's `load_state` checked its own weights
            if not (finite(a) and finite(b)):
                raise ValueError(f"adapter layer {path} holds NaN or infinite values")
            raise ValueError(f"adapter layer {path} overflows the model's {layer.weight.dtype} weight when merged")
        with torch.no_grad():
            layer.weight.copy_(merged)
    return len(paths)


def merge_scale(meta: dict, scale: float | None = None) -> float:
    """The scale an adapter is merged with: `scale` if given, else its recorded `merge_scale`, else 1."""
    s = float(meta.get("merge_scale", 1.0) if scale is None else scale)
    if not math.isfinite(s) or s < 0:
        raise UsageError(f"merge scale must be a finite number >= 0, got {s}")
    return s
