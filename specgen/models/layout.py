"""Decode-time weight layout: store Linear weights column-major on CPU, where small-batch matmuls run faster.

`nn.Linear` keeps its weight [out, in] row-major, and `F.linear(x, W)` for a few rows x [M, in] becomes
a GEMV/GEMM over that layout. On this project's CPU (AMD EPYC, torch 2.13 with MKL) the same product
runs faster when W's storage is [in, out] contiguous (W is then the transposed view of it). One core,
weights streamed from memory, row vs column-major side by side (`python -m specgen.models.layout`,
`recipes/tiny/logs/weight-layout.log`, measured while two training jobs shared the 2 cores):

    SmolLM2-135M, 200-token prefix:  1 new token 1.38x faster, 2 tokens 1.62x, 8 1.07x, 16 1.02x
    tiny image GPT, CFG batch 2:     1 token 1.18x, 4 tokens 1.34x, 30 tokens 1.06x
    tiny mesh GPT:                   1 token 1.11x, 5 tokens 1.08x

(on a quiet core, SmolLM2 1 token 1.18x, 2 tokens 1.53x, 16 tokens 0.98x).
One-token steps (AR baselines, drafters) gain most; wide verification forwards gain little. Every
decoder loads its weights this way, so baselines and speculative methods are measured on the same,
faster layout (a slower AR would inflate every speedup). Values are unchanged (same numbers, other
strides); training keeps the default layout. `SPECGEN_WEIGHT_LAYOUT=row` restores PyTorch's layout,
e.g. to measure the difference or on a CPU where it is slower.
"""

from __future__ import annotations

import os

import torch
from torch import nn

LAYOUTS = ("col", "row")
ENV = "SPECGEN_WEIGHT_LAYOUT"


def layout_name() -> str:
    """The layout to use: `SPECGEN_WEIGHT_LAYOUT` (col | row), default col."""
    name = os.environ.get(ENV, "col").strip().lower() or "col"
    if name not in LAYOUTS:
        from specgen.errors import UsageError

        raise UsageError(f"{ENV}={name!r}; choose from {', '.join(LAYOUTS)}")
    return name


@torch.no_grad()
def decode_layout(module: nn.Module, layout: str | None = None) -> nn.Module:
    """Re-store every CPU Linear weight of `module` column-major (in place; ties stay ties); returns it."""
    if (layout or layout_name()) != "col":
        return module
    for lin in module.modules():
        if isinstance(lin, nn.Linear) and lin.weight.device.type == "cpu" and lin.weight.stride(0) != 1:
            lin.weight.data = lin.weight.data.t().contiguous().t()  # same values, storage [in, out]
    return module


def _measure(model: nn.Module, shapes: list[tuple[int, int]], prefix: int, repeat: int) -> dict:
    """ms per forward of `model` (a Transformer) for (batch, new tokens) after a prefix, per layout."""
    import time

    out = {}
    for layout in ("row", "col"):
        if layout == "col":
            decode_layout(model, "col")
        for b, s in shapes:
            cache = model.new_cache(b, prefix + s + 1)
            if model.cfg.cross_dim:  # a mesh decoder: a random condition in place of a point cloud's
                model.set_context(cache, torch.randn(b, 64, model.cfg.cross_dim))
            ids = torch.randint(0, model.cfg.vocab_size, (b, prefix))
            with torch.inference_mode():
                model(ids, torch.arange(prefix).expand(b, -1), cache)
                for r in range(b):
                    cache.commit(r, list(range(prefix)))
                new, pos = torch.randint(0, model.cfg.vocab_size, (b, s)), torch.arange(prefix, prefix + s).expand(b, -1)
                for _ in range(2):
                    model(new, pos, cache)
                t = time.perf_counter()
                for _ in range(repeat):
                    model(new, pos, cache)
            out[(layout, b, s)] = (time.perf_counter() - t) / repeat * 1e3
    return out


def main() -> None:
    """Print the row/col timings of the built-in decoders (one thread): `python -m specgen.models.layout`."""
    from specgen import registry

    torch.set_num_threads(1)
    cases = {"smollm2-135m": ([(1, 1), (1, 2), (1, 8), (1, 16)], 200, 10),
             "tiny-image-gpt": ([(2, 1), (2, 4), (2, 30)], 100, 50),
             "mesh-gpt-tiny": ([(1, 1), (1, 5)], 60, 100)}
    for name, (shapes, prefix, repeat) in cases.items():
        entry = registry.find(name)
        model = registry.load_module(entry)
        model = getattr(model, "decoder", model)  # MeshGPT: time its Transformer
        ms = _measure(model, shapes, prefix, repeat)
        for b, s in shapes:
            row, col = ms[("row", b, s)], ms[("col", b, s)]
            print(f"{name}: batch {b}, {s} new tokens after {prefix}: row-major {row:.2f} ms, "
                  f"column-major {col:.2f} ms, {row / col:.2f}x")


if __name__ == "__main__":
    main()
