"""Text targets as base + scale x LoRA adapter: the merge every distilled model goes through, and scaled variants."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from specgen import builtins, checkpoints, registry
from specgen.errors import IncompatibleError, UsageError
from specgen.models.lora import merge_lora_state, merge_scale
from specgen.models.tokenizer import TextTokenizer, copy_tokenizer, tokenizer_hash


def shipped_adapter(name: str) -> tuple[registry.Entry, dict[str, torch.Tensor]]:
    """(entry, float32 state) of the adapter shipped for built-in distilled target `name` (specgen/assets/text/)."""
    src = builtins.ASSETS / "text" / name
    if not (src / "adapter.json").is_file() or not (src / "adapter.safetensors").is_file():
        raise UsageError(builtins.not_shipped(name))
    meta = json.loads((src / "adapter.json").read_text())
    state = {k: v.float() for k, v in load_file(str(src / "adapter.safetensors")).items()}
    return registry.Entry("adapter", name, src, meta), state


def materialize_distilled(name: str, progress=None) -> registry.Entry:
    """Built-in target/<name> = its base with the LoRA adapter of `specgen/assets/text/<name>/` merged in."""
    adapter, state = shipped_adapter(name)
    return register_merged(adapter, state, name, extra_meta={
        "source": f"specgen/assets/text/{name}", "created_by": "builtin",
        "asset_sha": builtins.asset_fingerprint(f"text/{name}")}, progress=progress, force=True, builtin=True)


builtins.DERIVERS["lora-merge"] = materialize_distilled  # registered on import (text/target.py imports this module)


def adapter_source(source: str, progress=None) -> tuple[registry.Entry, dict[str, torch.Tensor] | None]:
    """An adapter to merge: a registry adapter entry (state read at merge), or a built-in distilled target's
    shipped adapter (`smollm2-135m-pcllm`)."""
    builtin = source.removeprefix("target/")
    if builtin in builtins.TEXT_DISTILLED:
        return shipped_adapter(builtin)
    entry = checkpoints.find(source, progress)
    if entry.kind != "adapter":
        known = ", ".join(builtins.TEXT_DISTILLED)
        raise UsageError(f"{entry.ref} is not a LoRA adapter; give adapter/<name> (from `specgen distill`) or one of {known}")
    return entry, None


def merged_module(adapter: registry.Entry, base: registry.Entry, device: str = "cpu",
                  state: dict | None = None, scale: float | None = None,
                  tokenizer: TextTokenizer | None = None) -> tuple[torch.nn.Module, TextTokenizer]:
    """`base` with the LoRA `adapter` merged in at `scale` (default: its `merge_scale`, else 1), which must have been
    trained for it; `tokenizer`: base's, when already loaded."""
    tokenizer = tokenizer or TextTokenizer.load(base.path)
    want = adapter.meta.get("tokenizer_hash")
    if want and want != tokenizer_hash(tokenizer):  # first: of two mismatches, the one that says more
        raise IncompatibleError(f"{adapter.ref} was trained with tokenizer {want}, but {base.ref} has "
                                f"{tokenizer_hash(tokenizer)}")
    registry.check_pair(adapter, base)
    module = checkpoints.load_module(base, device)
    try:
        merge_lora_state(module, registry.read_state(adapter) if state is None else state,
                         adapter.meta["lora_rank"], adapter.meta["lora_alpha"] * merge_scale(adapter.meta, scale))
    except (ValueError, KeyError) as e:
        raise IncompatibleError(f"{adapter.ref} cannot merge into {base.ref}: {e}") from None
    return module.eval(), tokenizer


def register_merged(adapter: registry.Entry, state: dict | None, name: str, scale: float | None = None,
                    extra_meta: dict | None = None, progress=None, force: bool = False,
                    builtin: bool = False) -> registry.Entry:
    """Register target/<name> = the adapter's base with the adapter merged at `scale` (default: its merge_scale)."""
    s = merge_scale(adapter.meta, scale)
    base = checkpoints.find_linked(adapter, adapter.meta.get("parent", ""), "was trained for", progress)
    if base.meta.get("modality", "text") != "text" or not base.meta.get("tokenizer"):
        raise UsageError(f"{adapter.ref} adapts {base.ref}, not a text model with a tokenizer; registry merge makes "
                         "text targets (mesh LoRA adapters are merged when their heads load)")
    module, _ = merged_module(adapter, base, "cpu", state, scale=s)
    meta = {"builder": "transformer", "kwargs": module.cfg.to_dict(), "vocab_size": module.cfg.vocab_size,
            "modality": "text", "tokenizer": True, "distilled_from": base.ref, "merge_scale": s,
            "adapter": adapter.meta, **(extra_meta or {})}
    return registry.save("target", name, module.state_dict(), meta, extra=lambda d: copy_tokenizer(Path(base.path), d),
                         force=force, builtin=builtin)
