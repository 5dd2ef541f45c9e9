"""Does distillation transfer? Jacobi TPF of each model on training prompts vs held-out HumanEval prompts.

    python scripts/pcllm_tpf_split.py --models smollm2-135m,smollm2-135m-pcllm --prompts 16

Decodes the first `--prompts` built-in stdlib prompts (the distilled model's training data; the recipe
trains on the first 464) and the first `--prompts` HumanEval problems with greedy Jacobi (block 16, one
torch thread) and prints tokens, forwards and TPF = tokens / forwards (prefill counted) per model and
split. A distilled model whose TPF rises on the first split but not on the second has learnt its
training trajectories, not parallel decoding. Not a speed benchmark (`specgen benchmark` is).
"""

from __future__ import annotations

import argparse
import time

import torch

from specgen.data.stdlib_prompts import stdlib_prompts
from specgen.eval import humaneval
from specgen.text.generate import TextGenConfig, generate_text
from specgen.text.target import load_text_model
from specgen.request import parse_request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,smollm2-135m-pcllm")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits = {"train (stdlib)": stdlib_prompts(args.prompts),
              "held-out (HumanEval)": [humaneval.build_user_message(p) for p in humaneval.load_problems(args.prompts)]}
    print(f"{'model':<24} {'split':<22} {'prompts':>7} {'tokens':>7} {'forwards':>8} {'TPF':>6} {'s':>5}")
    for name in args.models.split(","):
        model = load_text_model(name)
        cfg = TextGenConfig(method="jacobi", model=name, max_new_tokens=args.max_new_tokens,
                            method_options={"block_size": args.block_size})
        for split, prompts in splits.items():
            t0 = time.perf_counter()
            results = generate_text(model, parse_request(cfg, "text"), prompts)
            tokens = sum(r.stats["new_tokens"] for r in results)
            forwards = sum(r.stats["nfe"] for r in results)
            print(f"{name:<24} {split:<22} {len(results):>7} {tokens:>7} {forwards:>8} {tokens / forwards:>6.3f} "
                  f"{time.perf_counter() - t0:>5.0f}", flush=True)


if __name__ == "__main__":
    main()
