"""`specgen generate` options that belong to another modality are refused, never silently ignored."""

from __future__ import annotations

from specgen.errors import UsageError

#: request field -> (its flag, the modalities that read it)
MODALITY_OPTIONS = {
    "prompts": ("--prompt", ("text",)),
    "prompts_file": ("--prompts", ("text",)),
    "chat": ("--no-chat", ("text",)),
    "max_new_tokens": ("--max-new-tokens", ("text", "mesh")),
    "out_dir": ("--out-dir", ("image", "mesh")),
    "num": ("--num", ("image", "mesh")),
    "classes": ("--classes", ("image",)),
    "cfg_scale": ("--cfg-scale", ("image",)),
    "captions": ("--captions", ("image",)),
    "point_clouds": ("--point-clouds", ("mesh",)),
}


def check_modality_options(modality: str, req) -> None:
    """Refuse the first option given for a modality other than the model's (e.g. --classes for a text model)."""
    for field, (flag, modalities) in MODALITY_OPTIONS.items():
        value = getattr(req, field, None)
        if value is not None and value != [] and modality not in modalities:
            raise UsageError(f"{flag} is for {' and '.join(modalities)} models; this is {article(modality)} model")


def article(modality: str) -> str:
    return f"{'an' if modality[0] in 'aeiou' else 'a'} {modality}"
