"""Load a text target (registry name or path) with its tokenizer; optional LoRA-merged variants later."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen import registry
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.models.tokenizer import TextTokenizer


@dataclass
class TextModel:
    """A loaded text target: module, loop adapter, tokenizer and registry entry."""

    module: torch.nn.Module
    target: ModelTarget
    tokenizer: TextTokenizer
    entry: registry.Entry


def load_text_model(name: str, device: str = "cpu", progress=None) -> TextModel:
    """Resolve `name` in the registry (materialising built-ins) and load it for decoding."""
    entry = registry.find(name, progress)
    if entry.meta.get("modality", "text") != "text" or not entry.meta.get("tokenizer"):
        raise UsageError(f"{entry.ref} is not a text model with a tokenizer")
    module = registry.load_module(entry, device)
    target = ModelTarget(module)
    target.device = device
    return TextModel(module, target, TextTokenizer.load(entry.path), entry)
