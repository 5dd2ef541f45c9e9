"""Replay `ngram` draft policies against the target's own greedy answers: tokens per step and per unit of verify cost.

Greedy decoding makes a drafter's every step a function of the sequence alone, so a policy can be scored without
running the target: from each state, propose, accept the longest prefix that matches the target's answer, advance by
accepted + 1 (the bonus token). What a policy earns per unit of time is tokens / sum of c(draft + 1) over its steps,
c = the target's measured cost curve (`decoding/cost.py`), so length policies are compared before any benchmark.

Run: `python scripts/ngram_draft_replay.py --model smollm2-135m+int4 --offset 0 --limit 30`. The greedy answers are
decoded once (AR on the same target) and kept in --answers (JSON) for later runs.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from specgen.decoding.cost import cost_of
from specgen.decoding.sampling import SamplingParams
from specgen.eval import humaneval
from specgen.methods import ngram_cache, run_batch
from specgen.methods.text import EmptyDrafter, lookup
from specgen.text.target import load_text_model


def answers(tm, prompts: list[list[int]], new: int, path: Path) -> list[list[int]]:
    """The target's greedy answers to `prompts` (read from `path` when it holds them)."""
    key = f"{tm.entry.ref if hasattr(tm, 'entry') else ''}:{new}"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key and saved.get("prompts") == prompts:
            return saved["answers"]
    out = run_batch(tm.target, lambda i: EmptyDrafter(), prompts, new, SamplingParams(0.0), tm.tokenizer.stop_ids,
                    batch_size=8)
    got = [r.tokens for r in out.results]
    path.write_text(json.dumps({"key": key, "prompts": prompts, "answers": got}))
    return got


def sources(seq: list[int], k: int, cache) -> list[tuple[str, list[int]]]:
    """(label, draft) candidates the way `NgramDrafter` looks: prompt lookup by n-gram length, then the cache."""
    for n in (3, 2):
        d = lookup(seq, k, n, n)
        if d:
            return [(f"lookup{n}", d)]
    if cache is not None:
        d = cache.draft(seq, k)
        if d:
            return [("cache", d)]
    return []


def replay(prompts, outs, policy, cost) -> tuple[float, float, dict]:
    """(tokens per step, tokens per unit cost, per-source acceptance by draft position) of `policy(seq) -> draft`."""
    tokens = steps = spent = 0.0
    seen = defaultdict(lambda: [0, 0])  # (source, position) -> [proposed, accepted]
    for prompt, out in zip(prompts, outs):
        pos = 0
        while pos < len(out):
            seq = prompt + out[:pos]
            label, draft = policy(seq)
            draft = draft[: max(0, len(out) - pos - 1)]
            a = 0
            while a < len(draft) and draft[a] == out[pos + a]:
                a += 1
            for j in range(min(len(draft), a + 1)):  # positions tried: the accepted ones and the first miss
                seen[(label, j)][0] += 1
                seen[(label, j)][1] += j < a
            pos += a + 1
            tokens += a + 1
            steps += 1
            spent += cost(len(draft) + 1)
    return tokens / steps, tokens / spent, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m+int4")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--cache", default="smollm2-135m")
    ap.add_argument("--answers", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tm = load_text_model(args.model)
    problems = humaneval.load_problems(args.limit, args.offset)
    prompts = [tm.tokenizer.encode(humaneval.build_user_message(q)) for q in problems]
    path = Path(args.answers or f"/tmp/ngram-replay-{args.model}-{args.offset}-{args.limit}.json")
    outs = answers(tm, prompts, args.new, path)
    cost = cost_of(tm.module)
    print(f"# {args.model}, HumanEval {args.limit} from {args.offset}, greedy, {args.new} new tokens; c(m) 1 thread:",
          ", ".join(f"c({m})={cost(m):.2f}" for m in range(1, 7)))
    cache = ngram_cache.load(args.cache) if args.cache else None
    print("| policy | tokens / step | tokens / cost | vs AR |")
    print("|---|---:|---:|---:|")
    for k in (1, 2, 3, 4, 5, 6):
        tps, tpc, seen = replay(prompts, outs, lambda s, k=k: (sources(s, k, cache) or [("none", [])])[0], cost)
        print(f"| fixed k = {k} | {tps:.3f} | {tpc:.3f} | {tpc:.2f} |", flush=True)
    _, _, seen = replay(prompts, outs, lambda s: (sources(s, 8, cache) or [("none", [])])[0], cost)
    print("\nacceptance by source and draft position (k = 8): accepted / tried")
    for label in sorted({lab for lab, _ in seen}):
        row = [f"{seen[(label, j)][1]}/{seen[(label, j)][0]}" for j in range(8) if seen[(label, j)][0]]
        print(f"{label:8s}", " ".join(row))


if __name__ == "__main__":
    main()
