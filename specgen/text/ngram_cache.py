"""Build a static n-gram cache (methods/ngram_cache.py) from a target's greedy answers to the stdlib (code) prompts
and the general prompts (`-m`)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from specgen.data.general_prompts import general_fingerprint, general_prompts
from specgen.data.stdlib_prompts import stdlib_fingerprint, stdlib_prompts
from specgen.decoding.sampling import SamplingParams
from specgen.methods import run_batch
from specgen.methods.ngram_cache import save
from specgen.methods.text import EmptyDrafter
from specgen.models.tokenizer import tokenizer_hash
from specgen.text.target import load_text_model


def main() -> None:
    """Decode the built-in stdlib and general prompts greedily with a target and save its answers as a cache file."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=1500, help="stdlib prompts decoded (the first LIMIT, shuffled)")
    ap.add_argument("--general", type=int, default=None, help="general prompts decoded after them (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.out.exists() and not args.out.is_file():  # the write renames a file over it: never a device or folder
        ap.error(f"--out {args.out} is not a file")
    torch.set_num_threads(args.threads)
    model = load_text_model(args.model, "cpu")
    stdlib = stdlib_prompts()
    random.Random(0).shuffle(stdlib)  # a fixed reshuffle of the set's own order: the shipped cache's prompts
    stdlib, general = stdlib[: args.limit], general_prompts(args.general)
    prompts = [model.tokenizer.encode(p) for p in stdlib + general]
    batch = run_batch(model.target, lambda i: EmptyDrafter(), prompts, args.max_new_tokens, SamplingParams(),
                      model.tokenizer.stop_ids, batch_size=args.batch_size)
    answers = [r.tokens for r in batch.results]
    how = (f"greedy answers of {args.model} to {len(stdlib)} stdlib prompts ({stdlib_fingerprint()}, reshuffled "
           f"with seed 0) and {len(general)} general prompts ({general_fingerprint()}), {args.max_new_tokens} new "
           f"tokens, batch {args.batch_size}, {args.threads} thread(s)")
    save(args.out, answers, tokenizer_hash(model.tokenizer), how)
    print(f"wrote {args.out}: {sum(map(len, answers))} tokens ({how})")


if __name__ == "__main__":
    main()
