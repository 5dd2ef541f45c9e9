"""Safetensors files written whole (a reader sees the old file or the new one), and tensors cached in one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from specgen import registry
from specgen.paths import atomic_write, check_folder


def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """`tensors` (made contiguous) as one safetensors file at `path`, written whole (`paths.atomic_write`)."""
    atomic_write(path, lambda p: registry.save_safetensors({k: v.contiguous() for k, v in tensors.items()}, p,
                                                           metadata, name=path))


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What `save_tensors` wrote: the tensors and the metadata (OSError, SafetensorError where unreadable)."""
    with safe_open(str(path), "pt") as f:  # one open for both (load_file would open the file again)
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def cached_tensors(path: Path, build: Callable[[], dict[str, torch.Tensor]],
                   log: Callable[[str], None] = lambda s: None) -> dict[str, torch.Tensor]:
    """Tensors cached at `path` (safetensors); `build()` makes them on a miss or over an unreadable file."""
    if path.is_file():
        try:
            t = load_file(str(path))
            log(f"cache hit: {path}")
            return t
        except (OSError, SafetensorError) as e:  # truncated or not safetensors (files are written whole): rebuilt
            log(f"unreadable cache {path} ({e}): rebuilding it")
    check_folder(path.parent, "cache folder")  # before the build's work, which a failed write would lose
    t = build()
    save_tensors(path, t)
    return t
