"""The decode loop shared by every draft-and-verify method (AR is the empty draft).

Each step: 1 propose -> 2 verify (one target forward over root + draft) -> 3 accept (pure rule)
-> 4 commit (keep the accepted path's KV) -> 5 update the drafter. One row at a time for now; the
cache and the stats keep per-row state so batching can be added without changing the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from specgen.decoding.accept import accept_greedy, accept_rejection
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import SamplingParams, logits_to_probs, pick
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import Target, TargetOut


class Drafter(Protocol):
    """Proposes drafts and re-synchronises after each verdict."""

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        """Start a new sequence; `first` is the prefill output."""
        ...

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        """A draft of at most `budget` nodes (depth) following `seq` (prompt + generated)."""
        ...

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        """Learn the outcome; `out` is the verify forward (row 0 = root)."""
        ...


@dataclass(frozen=True)
class DecodeResult:
    """Generated token ids (prompt excluded) and the run's statistics."""

    tokens: list[int]
    stats: DecodeStats


def verify_inputs(root: int, draft: Draft, start: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [1, N+1], positions [1, N+1] and ancestor mask [N+1, N+1] for root + draft."""
    tokens = torch.tensor([(root,) + draft.tokens], device=device)
    positions = (start + draft.tree.offsets()).unsqueeze(0).to(device)
    return tokens, positions, draft.tree.mask().to(device)


def judge(draft: Draft, logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
    """Lossless acceptance: greedy match at temperature 0, tree rejection sampling otherwise."""
    if params.greedy:
        return accept_greedy(draft, logits.argmax(-1).tolist())
    return accept_rejection(draft, logits_to_probs(logits, params), generator)


def decode(
    target: Target,
    drafter: Drafter,
    prompt: list[int],
    max_new_tokens: int,
    params: SamplingParams,
    stop_ids: tuple[int, ...] = (),
    generator: torch.Generator | None = None,
    max_draft: int = 256,
    rule: Callable[[Draft, torch.Tensor, SamplingParams, torch.Generator | None], Verdict] | None = None,
) -> DecodeResult:
    """Generate up to `max_new_tokens` after `prompt`, stopping after any of `stop_ids`.

    `rule` is the accept rule (default `judge`: lossless); relaxed methods pass their own.
    """
    rule = rule or judge
    stats = DecodeStats()
    device = target.device if hasattr(target, "device") else "cpu"
    cache = target.new_cache(1, len(prompt) + max_new_tokens + max_draft + 1)
    # 0. prefill the prompt and pick the first token from its last position
    with stats.timed("prefill"):
        first = target.prefill(torch.tensor([prompt], device=device), cache)
        out = [pick(first.logits[0, -1], params, generator)]
    stats.target_forwards += 1
    with stats.timed("propose"):
        drafter.reset(prompt, first)
    stopped = hit_stop(out, stop_ids)
    while len(out) < max_new_tokens and not stopped:
        budget = min(max_draft, max_new_tokens - len(out) - 1)
        with stats.timed("propose"):
            draft = drafter.propose(prompt + out, budget, stats)  # 1. propose
        with stats.timed("verify"):
            tokens, positions, mask = verify_inputs(out[-1], draft, cache.lengths[0], device)
            result = target.forward(tokens, positions, cache, mask)  # 2. verify
        with stats.timed("accept"):
            verdict = rule(draft, result.logits[0], params, generator)  # 3. accept
        with stats.timed("commit"):
            keep = [0] + [i + 1 for i in verdict.path]
            for row in range(cache.batch):  # 4. commit root + path (every branch row, e.g. CFG)
                cache.commit(row, keep)
        with stats.timed("propose"):
            drafter.on_accept(draft, verdict, result)  # 5. update the drafter
        stats.record_step(draft.size, draft.tree.max_depth(), verdict.num_accepted)
        out.extend(verdict.tokens)
        stopped = hit_stop(verdict.tokens, stop_ids)
    out = truncate(out, max_new_tokens, stop_ids)
    stats.new_tokens = len(out)
    return DecodeResult(out, stats)


def hit_stop(tokens: list[int], stop_ids: tuple[int, ...]) -> bool:
    """Whether a step emitted a stop token anywhere: a multi-token step can accept one mid-chunk, and
    checking only the last token would keep decoding (and counting forwards) past the end of the text."""
    return any(t in stop_ids for t in tokens)


def truncate(tokens: list[int], limit: int, stop_ids: tuple[int, ...]) -> list[int]:
    """Cut after the first stop token and at the token limit."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: min(i + 1, limit)]
    return tokens[:limit]
