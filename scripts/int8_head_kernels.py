"""The quantized SmolLM2's LM head (int8 table [49152, 576]): torch's int8 kernel against the bf16 copy of the table
through oneDNN's packed GEMM (`models/quantize.py:blocked_head`), per row count, and the blocked kernel's row
invariance: a row computed inside products of M rows against the same row alone (both padded to `HEAD_ROWS`).

Run: `python scripts/int8_head_kernels.py > docs/logs/int8-head-kernels.log`
"""

from __future__ import annotations

import time

import torch

from specgen.models import quantize
from specgen.models.quantize import ACT_DTYPE, INT8_MM, blocked_head
from specgen.text.target import load_text_model


def best_ms(fn, reps: int = 40) -> float:
    for _ in range(5):
        fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


@torch.inference_mode()
def main() -> None:
    torch.set_num_threads(1)
    head = load_text_model("smollm2-135m+int4").module.output
    rows = quantize.HEAD_ROWS
    packed = torch.ops.mkldnn._reorder_linear_weight(head.dequantize().to(ACT_DTYPE), rows)
    x = torch.randn(64, head.in_features, generator=torch.Generator().manual_seed(0)).to(ACT_DTYPE)
    print(f"# torch {torch.__version__}, 1 thread; LM head [{head.out_features}, {head.in_features}]; ms per product")
    print("| rows | int8 kernel | packed bf16, one product | blocked (products of", rows, "rows) |")
    print("|---:|---:|---:|---:|")
    for m in (1, 2, 4, 5, 8, 16):
        xm = x[:m].contiguous()
        one = best_ms(lambda: torch.ops.mkldnn._linear_pointwise(xm, packed, None, "none", [], ""))
        print(f"| {m} | {best_ms(lambda: INT8_MM(xm, head.qweight, head.scales)):.2f} | {one:.2f} | "
              f"{best_ms(lambda: blocked_head(xm, packed, rows)):.2f} |", flush=True)
    alone = torch.cat([blocked_head(x[i : i + 1], packed, rows) for i in range(64)])
    same = all(torch.equal(blocked_head(x[:m], packed, rows), alone[:m]) for m in range(1, 65))
    print(f"\nblocked: every row of products of 1..64 rows bitwise equal to the row alone: {same}")


if __name__ == "__main__":
    main()
