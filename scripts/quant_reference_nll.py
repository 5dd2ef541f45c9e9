"""What does each precision cost SmolLM2-135M on reference text: its own NLL of HumanEval's canonical programs?

The benchmark's quality column (`nll_base`: the float32 model's NLL of each row's greedy outputs) moves with where
greedy paths diverge, so on 30 prompts it is noisy. This is the low-variance measure quantization papers use:
teacher-forced, each precision scores the same text, the prompt + canonical solution of problems [offset,
offset + limit) (the benchmark's held-out prompts by default), NLL per token of the solution, no chat template.

The last rows are what-ifs, not shipped modes: int4 with the LM head in int4 too (groups of 32) instead of int8, and
int4 on torch's kernels (bfloat16 activations) instead of qmm.c (15-bit activations), where qmm.c is built.

Run: `python scripts/quant_reference_nll.py > docs/logs/quant-reference-nll.log`
"""

from __future__ import annotations

import argparse

import torch

from specgen.data import humaneval
from specgen.eval.text_bench import base_nll
from specgen.models import quantize
from specgen.models.quantize import QuantizedLinear
from specgen.text.target import load_text_model

MODELS = ("smollm2-135m", "smollm2-135m+bf16", "smollm2-135m+int8", "smollm2-135m+int4")


def int4_head(model):
    """`model` (an int4 text model) with its LM head re-quantized to int4 from the float32 original's."""
    original = load_text_model("smollm2-135m", decode=False).module.output  # nn.Linear [V, dim]
    model.module.output = QuantizedLinear.from_linear(original, "int4", 32)  # the embedding keeps its int8 table
    return model


def torch_kernels(model):
    """`model` (an int4 text model) with its quantized products on torch's kernels (bfloat16 activations); every
    layer made after this in the process too (the last what-if)."""
    quantize.quantized_product = lambda in_features, group: "torch"
    for lin in quantize.quantized_layers(model.module).values():
        lin.__dict__.pop("_kernel", None)  # made again, on torch's kernel, at the next product
    return model


WHAT_IFS = {"int4 head": int4_head, "torch kernels": torch_kernels}


def reference_nll(name: str, problems: list[humaneval.Problem], what_if: str = "") -> tuple[float, int]:
    """(mean NLL per solution token, token count) of the canonical solutions under model `name` (the benchmark's
    teacher-forced `base_nll`, here of the reference text instead of a row's outputs)."""
    model = load_text_model(name)
    if what_if:
        model = WHAT_IFS[what_if](model)
    total, count = 0.0, 0
    for p in problems:
        start = len(model.tokenizer.encode(p.prompt))
        ids = model.tokenizer.encode(p.prompt + p.canonical_solution)
        nll, n = base_nll(model, ids[:start], ids[start:])
        total, count = total + nll, count + n
    return total / count, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--offset", type=int, default=100)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    problems = humaneval.load_problems(args.limit, args.offset)
    print(f"HumanEval problems {args.offset}..{args.offset + len(problems) - 1}: prompt + canonical solution, "
          "NLL per solution token (teacher-forced)")
    names = args.models.split(",")
    base = None
    for name, what_if in [(n, "") for n in names] + [("smollm2-135m+int4", w) for w in WHAT_IFS]:
        nll, count = reference_nll(name, problems, what_if)
        base = nll if base is None else base
        label = name + (f" ({what_if})" if what_if else "")
        print(f"{label:32s} {nll:.4f}  ({count} tokens)  {100 * (nll / base - 1):+.2f}% vs {names[0]}")


if __name__ == "__main__":
    main()
