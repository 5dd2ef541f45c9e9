"""Whole-decoder forward times per weight layout (row-major, column-major, packed), interleaved, one thread: the
c(n) = time(n tokens) / time(1 token) of the built-in decoders. Run: `python scripts/layout_forward_times.py`.
Cited by docs/results/text.md ("Verify cost c(n) and the CPU weight layout")."""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from specgen import checkpoints
from specgen.models import packed_linear
from specgen.models.layout import LAYOUTS, decode_layout


def _forward_ms(model: nn.Module, b: int, s: int, prefix: int, repeat: int) -> float:
    """ms per cached forward of `model` (a Transformer) over s new tokens in each of b rows after a prefix."""
    cache = model.new_cache(b, prefix + s + 1)
    if model.cfg.cross_dim:  # a mesh decoder: a random condition in place of a point cloud's
        cond = torch.randn(b, 64, model.cfg.cross_dim, generator=torch.Generator().manual_seed(0))
        cache.cross = model.context_kv(cond)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.cfg.vocab_size, (b, prefix), generator=gen)
    with torch.inference_mode():
        model(ids, torch.arange(prefix).expand(b, -1), cache)
        for r in range(b):
            cache.commit(r, list(range(prefix)))
        new = torch.randint(0, model.cfg.vocab_size, (b, s), generator=gen)
        pos = torch.arange(prefix, prefix + s).expand(b, -1)
        model(new, pos, cache)
        t = time.perf_counter()
        for _ in range(repeat):
            model(new, pos, cache)
    return (time.perf_counter() - t) / repeat * 1e3


def measure(load, shapes: list[tuple[int, int]], prefix: int, repeat: int, rounds: int = 3) -> dict:
    """Best-of-rounds ms per forward for each (layout, batch, new tokens); one model copy per layout from
    `load()`, layouts interleaved within each round so load changes hit them alike."""
    layouts = [lay for lay in LAYOUTS if lay != "packed" or packed_linear.available()]
    models = {layout: decode_layout(load(), layout) for layout in layouts}
    out: dict = {}
    for _ in range(rounds):
        for b, s in shapes:
            for layout, model in models.items():
                ms = _forward_ms(model, b, s, prefix, repeat)
                out[(layout, b, s)] = min(ms, out.get((layout, b, s), ms))
    return out


def main() -> None:
    """Print per-layout forward times and c(n) = time(n tokens) / time(1 token) of the built-in decoders
    (one thread)."""
    torch.set_num_threads(1)
    cases = {"smollm2-135m": ([(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (1, 32)], 200, 5),
             "tiny-image-gpt": ([(2, 1), (2, 4), (2, 30), (2, 60)], 100, 30),
             "mesh-gpt-tiny": ([(1, 1), (1, 3), (1, 5)], 60, 100)}
    for name, (shapes, prefix, repeat) in cases.items():
        entry = checkpoints.find(name)
        ms = measure(lambda: _decoder(checkpoints.load_module(entry)), shapes, prefix, repeat)
        layouts = sorted({k[0] for k in ms}, key=LAYOUTS.index)
        for b, s in shapes:
            cells = ", ".join(f"{lay} {ms[(lay, b, s)]:.2f} ms (c {ms[(lay, b, s)] / ms[(lay, b, 1)]:.2f})"
                              for lay in layouts)
            print(f"{name}: batch {b}, {s} new tokens after {prefix}: {cells}", flush=True)


def _decoder(model: nn.Module) -> nn.Module:
    """The Transformer to time: MeshGPT's decoder, else the model itself."""
    return getattr(model, "decoder", model)


if __name__ == "__main__":
    main()
