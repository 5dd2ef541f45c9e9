"""Tiny random class-conditional image targets (LlamaGen c2i layout) for drafter and CLI tests."""

from __future__ import annotations

import dataclasses

import torch

from specgen.models.llamagen import llamagen_config
from specgen.models.transformer import Transformer

VOCAB, GRID, CLASSES = 32, 4, 3


def tiny_image_target(seed: int = 0, dim: int = 32, n_layers: int = 2) -> Transformer:
    """A random c2i GPT: 4x4 grid, 32 codes, 3 classes (+ null), 2D RoPE with a zero condition row."""
    torch.manual_seed(seed)
    cfg = dataclasses.replace(llamagen_config("gpt-tiny", vocab=VOCAB, grid=GRID, num_classes=CLASSES),
                              dim=dim, n_layers=n_layers, n_heads=4, n_kv_heads=4, ffn_dim=64)
    model = Transformer(cfg)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def register_tiny_image_target(name: str = "tiny-img", seed: int = 0):
    from specgen import registry

    model = tiny_image_target(seed)
    meta = {"builder": "llamagen-gpt", "kwargs": model.cfg.to_dict(), "vocab_size": VOCAB, "modality": "image",
            "grid": GRID, "classes": [f"c{i}" for i in range(CLASSES)]}
    return registry.save("target", name, model.state_dict(), meta, force=True)


def one_thread():
    """Generator for an autouse fixture: tiny models on a loaded 2-core machine are ~100x faster on 1 thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
