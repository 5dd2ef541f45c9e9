"""LoRA (Hu et al. 2022) for any nn.Module: wrap Linear layers, save only the adapters (their merge at load:
models/lora.py)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from specgen.errors import UsageError


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update: y = W x + (alpha / rank) * B (A x)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / rank)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))  # B = 0: a fresh adapter changes nothing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def check_targets(model: nn.Module, targets, owner: str) -> None:
    """`targets` names Linear layers of `model`, one at least; otherwise a UsageError naming those it has."""
    linears = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
    unknown = sorted(set(targets) - set(linears))
    if unknown or not targets:  # a misspelt name beside real ones would silently adapt fewer layers
        problem = f": {', '.join(unknown)} is no Linear layer of" if unknown else " is empty: name Linear layers of"
        raise UsageError(f"lora_targets{problem} {owner} (it has {', '.join(linears)})")


def apply_lora(model: nn.Module, targets: tuple[str, ...], rank: int = 16, alpha: float = 32.0) -> list[str]:
    """Wrap every Linear whose attribute name is in `targets`; returns the wrapped paths."""
    check_targets(model, targets, "the model")
    paths = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name.split(".")[-1] in targets]
    for path in paths:
        _set(model, path, LoRALinear(model.get_submodule(path), rank, alpha))
    return paths


def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter tensors, keyed by the wrapped layer's path (as if it were never wrapped)."""
    return {f"{name}.lora_{n}": getattr(m, f"lora_{n}").detach().clone() for name, m in model.named_modules()
            if isinstance(m, LoRALinear) for n in "AB"}


@contextlib.contextmanager
def lora_disabled(model: nn.Module):
    """Run the model as its frozen base (every LoRALinear's update scaled to zero) inside the block."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    scales = [m.scale for m in layers]
    for m in layers:
        m.scale = 0.0
    try:
        yield model
    finally:
        for m, sc in zip(layers, scales):
            m.scale = sc


def merge_lora(model: nn.Module) -> None:
    """Fold every LoRALinear into its base weight and put the plain Linear back."""
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            with torch.no_grad():
                m.base.weight += ((m.lora_B @ m.lora_A) * m.scale).to(m.base.weight.dtype)  # [out, in]
            m.base.requires_grad_(True)
            _set(model, name, m.base)
