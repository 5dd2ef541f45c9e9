"""Import external weights into the registry: HF folders, GGUF files, safetensors or .pt state dicts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specgen import registry
from specgen.errors import CheckpointError, UsageError

STATE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def read_state_file(path: Path) -> dict[str, torch.Tensor]:
    """A flat tensor dict from safetensors, or from a pickle read with weights_only=True (never unpickled)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, or a pickle with non-tensor objects refused by weights_only
        raise CheckpointError(f"cannot read {path.name} as a state dict: {str(e).splitlines()[0]}") from None
    for wrapper in ("model", "state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} is not a flat dict of tensors")
    return state


def import_checkpoint(source: Path, name: str, kind: str = "target", builder: str | None = None,
                      kwargs_path: Path | None = None, parent: str | None = None, progress=None) -> registry.Entry:
    """Convert `source` and save it as <kind>/<name>; validates before writing anything."""
    from specgen.builtins import import_gguf_target

    if not source.exists():
        raise UsageError(f"no such file or folder: {source}")
    if source.is_dir():
        return import_hf_folder(source, name)
    if source.suffix == ".gguf":
        import_gguf_target(source, name, progress, created_by="registry import")
        return registry.find(f"target/{name}")
    if source.suffix not in STATE_SUFFIXES:
        raise UsageError(f"cannot import {source.name}: expected a folder, .gguf, or one of {', '.join(STATE_SUFFIXES)}")
    if not builder or not kwargs_path:
        raise UsageError("a raw state dict needs --builder and --kwargs (a JSON file of builder arguments)")
    from specgen.builders import BUILDERS, CONVERTERS

    if builder not in BUILDERS:
        raise UsageError(f"unknown builder '{builder}'; builders: {', '.join(BUILDERS)}")
    try:
        kwargs = json.loads(Path(kwargs_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read builder kwargs {kwargs_path}: {e}") from None
    state = CONVERTERS.get(builder, lambda s, k: s)(read_state_file(source), kwargs)
    module = BUILDERS[builder](**kwargs)
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "output.weight" or not kwargs.get("tie_embeddings", True)]
    if missing or unexpected:
        bad = (missing or unexpected)[0]
        raise CheckpointError(f"{source.name} does not fit builder {builder}: {'missing' if missing else 'unexpected'} key {bad}")
    meta = {"builder": builder, "kwargs": kwargs, "vocab_size": kwargs.get("vocab_size"), "parent": parent,
            "source": str(source), "created_by": "registry import"}
    return registry.save(kind, name, dict(module.state_dict()), meta)


def import_hf_folder(folder: Path, name: str) -> registry.Entry:
    """An HF Llama/Qwen2 folder with its tokenizer."""
    from specgen.models.llama import load_hf_folder

    cfg, state = load_hf_folder(folder)
    has_tok = (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()

    def tokenizer(dest: Path) -> None:
        if has_tok:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(folder), local_files_only=True).save_pretrained(str(dest))

    return registry.save("target", name, state, {
        "builder": "transformer", "kwargs": cfg.to_dict(), "vocab_size": cfg.vocab_size, "modality": "text",
        "tokenizer": has_tok, "source": str(folder), "created_by": "registry import",
    }, extra=tokenizer)
