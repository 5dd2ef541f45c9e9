"""Decode-time weight layout: column-major Linear weights on CPU, plus a oneDNN-packed copy for multi-row products.

`nn.Linear` keeps its weight [out, in] row-major, and `F.linear(x, W)` for a few rows x [M, in] becomes
a GEMV/GEMM over that layout. On this project's CPU (AMD EPYC, torch 2.13 with MKL) the same product
runs faster when W's storage is [in, out] contiguous (W is then the transposed view of it): one-token
steps (AR baselines, drafters) gain most, wide verification forwards little (`python -m specgen.models.layout`
measures it; numbers in docs/results/text.md, "Kernel micro-benchmarks"). Every
decoder loads its weights this way, so baselines and speculative methods are measured on the same,
faster layout (a slower AR would inflate every speedup). Values are unchanged (same numbers, other
strides); training keeps the default layout.

Layouts (`SPECGEN_WEIGHT_LAYOUT`):
- `packed` (default where this torch has oneDNN): column-major, and every Linear becomes a
  `PackedLinear` (`models/packed_linear.py`): products of several rows (verification, Jacobi blocks,
  prefill) run on a oneDNN-packed copy, which reuses the weight across rows instead of paying per row
  (up to 4x on one core); products of fewer rows than the crossover measured for the model on this
  machine (`models/kernel_choice.py`) stay on MKL's GEMV over the column-major weight, which is faster
  there (a constant crossover slowed SmolLM2's AR step on one machine: docs/results/text.md);
- `col`: column-major only (the previous default);
- `row`: PyTorch's layout, e.g. to measure the difference or on a CPU where it is slower.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specgen.models import packed_linear

LAYOUTS = ("packed", "col", "row")
ENV = "SPECGEN_WEIGHT_LAYOUT"


def default_layout() -> str:
    """`packed` where this torch build has oneDNN's packed linear, else `col`."""
    return "packed" if packed_linear.available() else "col"


def layout_name() -> str:
    """The layout to use: `SPECGEN_WEIGHT_LAYOUT` (packed | col | row), default `default_layout()`."""
    from specgen.errors import UsageError

    name = os.environ.get(ENV, "").strip().lower() or default_layout()
    if name not in LAYOUTS:
        raise UsageError(f"{ENV}={name!r}; choose from {', '.join(LAYOUTS)}")
    if name == "packed" and not packed_linear.available():
        raise UsageError(f"{ENV}=packed needs a torch build with oneDNN (mkldnn); use col or row")
    return name


def applies_to(module: nn.Module) -> bool:
    """Whether the CPU layout applies: only to a module whose weights live on the CPU. Column-major storage and the
    oneDNN-packed copies are CPU kernel choices (MKL GEMV vs oneDNN GEMM), measured on this CPU; a model on cuda
    keeps PyTorch's layout and cuBLAS picks its own kernels (fence: `specgen/devices.py`, tests/test_devices.py)."""
    from specgen.devices import is_cpu, module_device

    return is_cpu(module_device(module))


@torch.no_grad()
def decode_layout(module: nn.Module, layout: str | None = None) -> nn.Module:
    """Re-store every CPU Linear weight of `module` column-major (in place; ties stay ties) and, for the
    `packed` layout, make each a PackedLinear; returns the module."""
    layout = layout or layout_name()
    from specgen.models.quantize import prepare_kernels

    prepare_kernels(module)  # int4 layers: their kernel copies now (any layout)
    if layout == "row" or not applies_to(module):
        return module
    for lin in module.modules():
        if isinstance(lin, nn.Linear) and lin.weight.device.type == "cpu" and lin.weight.stride(0) != 1:
            lin.weight.data = lin.weight.data.t().contiguous().t()  # same values, storage [in, out]
    if layout != "packed":
        return module
    packed_linear.pack_linears(module)
    packed_linear.measure_now(module)  # at load, not in the first timed product (threads set later: re-measured lazily)
    return module


def _forward_ms(model: nn.Module, b: int, s: int, prefix: int, repeat: int) -> float:
    """ms per cached forward of `model` (a Transformer) over s new tokens in each of b rows after a prefix."""
    import time

    cache = model.new_cache(b, prefix + s + 1)
    if model.cfg.cross_dim:  # a mesh decoder: a random condition in place of a point cloud's
        model.set_context(cache, torch.randn(b, 64, model.cfg.cross_dim, generator=torch.Generator().manual_seed(0)))
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
    (one thread): `python -m specgen.models.layout`."""
    from specgen import checkpoints

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
