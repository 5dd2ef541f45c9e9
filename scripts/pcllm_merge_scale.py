"""Choose the merge scale of a distilled text adapter on held-out training-distribution prompts (never HumanEval).

    python scripts/pcllm_merge_scale.py --adapter smollm2-135m-pcllm --scales 0.25,0.5,0.75,1

For every scale s, target = base + s x adapter (specgen/text/merge.py; registered as <adapter>-scale<s>)
decodes `--prompts` built-in stdlib prompts from `--offset` (3,000 by default: the shipped adapter trained
on the first 464, its ablations on the first 672) greedily, with prompt lookup (same tokens as AR, faster).
The ORIGINAL model then scores each scale's answers (mean per-token NLL, teacher-forced) against its own
greedy answers. Printed per scale: tokens, NLL, NLL / original, exact-match rate and mean common prefix
with the original's answers, Jacobi TPF (n 4) of the merged model. The last line is the chosen scale: the
largest whose NLL is within `--tolerance` (5%, the issue's goal) of the original's; 0 if none is.
Selection never reads HumanEval, which the benchmark then reports on.
"""

from __future__ import annotations

import argparse

import torch

from specgen.data.prompts import Prompt, encode
from specgen.data.stdlib_prompts import stdlib_prompts
from specgen.eval.text_bench import base_nll
from specgen.eval.text_rows import common_prefix
from specgen.generate.text import TextGenConfig, generate_text
from specgen.request import parse_request
from specgen.text.merge import adapter_source, register_merged
from specgen.text.target import load_text_model


def answers(model, prompts: list[str], method: str, options: dict) -> list:
    cfg = TextGenConfig(method=method, max_new_tokens=128, method_options=options)
    items = [Prompt(p) for p in prompts]  # encoded as `specgen generate` encodes them
    return generate_text(model, parse_request(cfg, "text"), items, [encode(model.tokenizer, p, cfg.chat) for p in items])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default="smollm2-135m-pcllm", help="adapter/NAME or a built-in distilled target")
    ap.add_argument("--scales", default="0.25,0.5,0.75,1")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--offset", type=int, default=3000)
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompts = stdlib_prompts(args.offset + args.prompts)[args.offset :]
    adapter, state = adapter_source(args.adapter)
    base = load_text_model(adapter.meta["parent"])
    ids = [base.tokenizer.encode(p) for p in prompts]

    def nll(results) -> float:
        parts = [base_nll(base, i, r.token_ids) for i, r in zip(ids, results)]
        return sum(x for x, _ in parts) / max(1, sum(c for _, c in parts))

    own = answers(base, prompts, "ngram", {})
    ref = nll(own)
    print(f"{len(prompts)} stdlib prompts from {args.offset}; original {adapter.meta['parent']}: "
          f"{sum(len(r.token_ids) for r in own)} tokens, NLL {ref:.4f}")
    print(f"{'scale':>6} {'tokens':>7} {'NLL':>7} {'ratio':>6} {'exact':>6} {'prefix':>7} {'jacobi TPF':>10}", flush=True)
    chosen = 0.0
    for s in (float(x) for x in args.scales.split(",")):
        name = f"{adapter.name}-scale{s:g}"
        register_merged(adapter, None if state is None else dict(state), name, s, {"created_by": "pcllm_merge_scale.py"})
        model = load_text_model(f"target/{name}")
        res = answers(model, prompts, "ngram", {})
        jac = answers(model, prompts, "jacobi", {"block_size": 4})
        tpf = sum(r.stats["new_tokens"] for r in jac) / sum(r.stats["nfe"] for r in jac)
        v = nll(res)
        exact = sum(r.token_ids == o.token_ids for r, o in zip(res, own)) / len(own)
        prefix = sum(common_prefix(r.token_ids, o.token_ids) for r, o in zip(res, own)) / len(own)
        print(f"{s:>6g} {sum(len(r.token_ids) for r in res):>7} {v:>7.4f} {v / ref:>6.3f} {exact:>6.3f} "
              f"{prefix:>7.1f} {tpf:>10.3f}", flush=True)
        if v <= ref * (1 + args.tolerance):
            chosen = max(chosen, s)
    print(f"chosen merge_scale: {chosen:g}")


if __name__ == "__main__":
    main()
