"""Prompt prefill of a quantized SmolLM2: the decode kernels against prompt mode (`models/prompt.py`).

Two tables, 1 thread, best of `--repeat`:
1. Every quantized product of the model summed, per row count: the quantized kernel against a bfloat16 GEMM on the
   weight dequantized into a workspace (`QuantizedLinear.prompt_weight`), which is where `PROMPT_MIN_ROWS` comes from.
2. Whole prefills of held-out HumanEval prompts: a decode step's kernels (row-invariant products, chunked invariant
   attention) against prompt mode, and whether the first greedy token agrees.

Run: `python scripts/quantized_prefill.py > docs/logs/quantized-prefill.log`
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from specgen.data import humaneval
from specgen.models import prompt, quantize
from specgen.models.quantize import ACT_DTYPE, QuantizedLinear
from specgen.text.target import load_text_model


def best_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


@torch.inference_mode()
def products(layers: list[QuantizedLinear], rows: int, repeat: int) -> tuple[float, float]:
    """ms of every layer's product of `rows` rows: (quantized kernel, prompt GEMM)."""
    xs = {k: torch.randn(rows, k, dtype=ACT_DTYPE) for k in {q.in_features for q in layers}}
    kernel = best_ms(lambda: [q.kernel()[0](xs[q.in_features], *q.kernel()[1]) for q in layers], repeat)
    gemm = best_ms(lambda: [F.linear(xs[q.in_features], q.prompt_weight()) for q in layers], repeat)
    return kernel, gemm


@torch.inference_mode()
def prefill(tm, ids: list[int], mode: bool, repeat: int) -> tuple[float, int]:
    """(ms, greedy first token) of one prefill in prompt mode or (mode False) with a decode step's kernels."""
    out, active = {}, prompt.active
    prompt.active = active if mode else (lambda: False)

    def run():
        cache = tm.module.new_cache(1, len(ids) + 1)
        out["logits"] = tm.target.prefill(torch.tensor([ids]), cache).logits

    try:
        ms = best_ms(run, repeat)
    finally:
        prompt.active = active
    return ms, int(out["logits"][0, -1].argmax())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--offset", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, 1 thread, best of {args.repeat}; PROMPT_MIN_ROWS = {quantize.PROMPT_MIN_ROWS}")
    for spec in ("smollm2-135m+int4", "smollm2-135m+int8"):
        tm = load_text_model(spec)
        layers = [q for q in tm.module.layers.modules() if isinstance(q, QuantizedLinear)]
        print(f"\n## {spec}: all {len(layers)} block products, ms")
        print("| rows | quantized kernel | prompt GEMM (dequantize + bf16) |\n|---:|---:|---:|")
        for rows in (8, 16, 32, 64, 128, 256):
            k, g = products(layers, rows, args.repeat)
            print(f"| {rows} | {k:.1f} | {g:.1f} |", flush=True)
        print(f"\n## {spec}: prefill, ms\n| prompt tokens | decode kernels | prompt mode | saving | same first token |")
        print("|---:|---:|---:|---:|---:|")
        for p in humaneval.load_problems(args.prompts, args.offset):
            ids = tm.tokenizer.encode(humaneval.build_user_message(p))
            slow, a = prefill(tm, ids, False, args.repeat)
            fast, b = prefill(tm, ids, True, args.repeat)
            print(f"| {len(ids)} | {slow:.0f} | {fast:.0f} | {1 - fast / slow:.0%} | {a == b} |", flush=True)


if __name__ == "__main__":
    main()
