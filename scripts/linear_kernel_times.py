"""Single products, MKL on the column-major weight vs oneDNN packed, per row count, one thread: the measurement
behind the packed layout's kernel crossover. Run: `python scripts/linear_kernel_times.py`. Cited by
docs/results/text.md ("MKL vs oneDNN per row count")."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from specgen.models.packed_linear import PACK_HINT


def _product_us(f, repeat: int) -> float:
    """Best-of-5 microseconds per call of f()."""
    for _ in range(max(3, repeat // 10)):
        f()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(repeat):
            f()
        best = min(best, (time.perf_counter() - t) / repeat)
    return best * 1e6


def main() -> None:
    """Print MKL vs oneDNN-packed microseconds per product for SmolLM2's, the mesh GPT's and BPT's shapes."""
    torch.set_num_threads(1)
    shapes = {"mesh wqkv": (256, 768), "BPT LM head": (256, 5121), "SmolLM2 wqkv": (576, 960),
              "SmolLM2 w1": (576, 1536), "SmolLM2 w2": (1536, 576), "SmolLM2 LM head": (576, 49152)}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (n_in, n_out) in shapes.items():
            w = torch.randn(n_out, n_in, generator=gen).t().contiguous().t()  # column-major, as decode_layout stores it
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)
            repeat = 20 if n_out > 10_000 else 1000
            for rows in (1, 2, 4, 5, 8, 16):
                x = torch.randn(rows, n_in, generator=gen)
                mkl = _product_us(lambda: F.linear(x, w), repeat)
                dnnl = _product_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeat)
                print(f"{name} {n_in} x {n_out}, {rows} rows: MKL column-major {mkl:.1f} us, "
                      f"oneDNN packed {dnnl:.1f} us ({mkl / dnnl:.2f}x)", flush=True)




if __name__ == "__main__":
    main()
