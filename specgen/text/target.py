"""Load a text target (registry name or path) with its tokenizer; LoRA adapter entries are merged at load."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen import registry
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.models.layout import decode_layout
from specgen.models.tokenizer import TextTokenizer


@dataclass
class TextModel:
    """A loaded text target: module, loop adapter, tokenizer and registry entry."""

    module: torch.nn.Module
    target: ModelTarget
    tokenizer: TextTokenizer
    entry: registry.Entry


def load_text_model(name: str, device: str = "cpu", progress=None, decode: bool = True) -> TextModel:
    """Resolve `name` in the registry (materialising built-ins) and load it for decoding.

    A LoRA adapter entry (`adapter/<name>`, written by `specgen distill`) loads its parent target
    with the adapter merged into the weights (no run-time cost). `decode` stores the weights in the
    decode layout (`models/layout.py`); training callers pass False.
    """
    entry = registry.find(name, progress)
    if entry.kind == "adapter":
        base = registry.find(entry.meta.get("parent", ""), progress)
        module, tokenizer = merged_module(entry, base, device)
    elif entry.meta.get("modality", "text") != "text" or not entry.meta.get("tokenizer"):
        raise UsageError(f"{entry.ref} is not a text model with a tokenizer")
    else:
        module, tokenizer = registry.load_module(entry, device), TextTokenizer.load(entry.path)
    if decode:
        decode_layout(module)
    target = ModelTarget(module)
    target.device = device
    return TextModel(module, target, tokenizer, entry)


def merged_module(adapter: registry.Entry, base: registry.Entry, device: str = "cpu",
                  state: dict | None = None, scale: float | None = None) -> tuple[torch.nn.Module, TextTokenizer]:
    """`base` with the LoRA `adapter` merged in at `scale` (default: its `merge_scale`, else 1; text/merge.py);
    refuses an adapter trained for another base (one line)."""
    from specgen.errors import IncompatibleError
    from specgen.text.merge import merge_scale
    from specgen.text.trajectories import tokenizer_hash
    from specgen.train.lora import merge_lora_state

    registry.check_pair(adapter, base)
    tokenizer = TextTokenizer.load(base.path)
    want = adapter.meta.get("tokenizer_hash")
    if want and want != tokenizer_hash(tokenizer):
        raise IncompatibleError(f"{adapter.ref} was trained with tokenizer {want}, but {base.ref} has "
                                f"{tokenizer_hash(tokenizer)}")
    module = registry.load_module(base, device)
    try:
        merge_lora_state(module, registry.read_state(adapter) if state is None else state,
                         adapter.meta["lora_rank"], adapter.meta["lora_alpha"] * merge_scale(adapter.meta, scale))
    except (ValueError, KeyError) as e:
        raise IncompatibleError(f"{adapter.ref} does not fit {base.ref}: {e}") from None
    return module.eval(), tokenizer
