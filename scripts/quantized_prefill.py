"""What would dequantize + GEMM save on prompt prefill of the quantized SmolLM2, and do its logits differ?

One question: `models/quantize.py` runs every product of a quantized layer on the quantized kernel (rows
independent, so outputs never depend on the batch or verify width). Prompt-sized products would be cheaper as
dequantize-to-bfloat16 + one GEMM; this times one prefill of HumanEval prompts both ways (1 thread, best of
`--repeat`) and counts how many last-position logits differ between the two kernels.

Run: `python scripts/quantized_prefill.py > docs/logs/quantized-prefill.log`
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from specgen.eval import humaneval
from specgen.models.quantize import ACT_DTYPE, QuantizedLinear
from specgen.text.target import load_text_model


def dequantized_product(self: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.dequantize().to(ACT_DTYPE))


@torch.inference_mode()
def prefill(tm, ids: list[int]) -> tuple[float, torch.Tensor]:
    cache = tm.module.new_cache(1, len(ids) + 1)
    t = time.perf_counter()
    out = tm.target.prefill(torch.tensor([ids]), cache)
    return (time.perf_counter() - t) * 1e3, out.logits[0, -1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, 1 thread, best of {args.repeat}; ms per prefill")
    print("| target | prompt tokens | quantized kernel | dequantize + GEMM | saving | logits differing (of V) |")
    print("|---|---:|---:|---:|---:|---:|")
    kernel = QuantizedLinear.product
    for spec in ("smollm2-135m+int8", "smollm2-135m+int4"):
        tm = load_text_model(spec)
        for p in humaneval.load_problems(args.prompts, 0):
            ids = tm.tokenizer.encode(humaneval.build_user_message(p))
            best = {}
            for _ in range(args.repeat):
                for name, fn in (("kernel", kernel), ("dequant", dequantized_product)):
                    QuantizedLinear.product = fn
                    ms, logits = prefill(tm, ids)
                    best[name] = min(best.get(name, (ms, logits))[0], ms), logits
            QuantizedLinear.product = kernel
            (k_ms, k_logits), (d_ms, d_logits) = best["kernel"], best["dequant"]
            print(f"| {spec} | {len(ids)} | {k_ms:.0f} | {d_ms:.0f} | {1 - d_ms / k_ms:.0%} | "
                  f"{int((k_logits != d_logits).sum())} of {k_logits.numel()} |", flush=True)


if __name__ == "__main__":
    main()
