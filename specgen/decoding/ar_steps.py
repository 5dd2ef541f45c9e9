"""AR's step policy: one forward a row a step, or several, each step's token (its argmax, or its draw from uniforms
drawn on the host) feeding the next on the device (`ar` run_ahead)."""

from __future__ import annotations

import torch

from specgen.decoding.accept import accept_sampled, draft_uniforms, walked_rows
from specgen.decoding.draft import Draft
from specgen.decoding.pool import PolicyBase, RowStep
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import Target, TargetOut
from specgen.decoding.verify import Span
from specgen.devices import host_tensor
from specgen.models.cache import KVCache


class ArSteps(PolicyBase):
    """AR with `steps` AR steps in each loop step, read on the host once: step j feeds step j - 1's token without the
    host seeing it. Exact: step j is AR's forward at length n + j over the same cache slots, and the loop keeps every
    node, as AR commits each. Its token is AR's greedy pick (the argmax of the same logits), or its draw: the
    draft-verify of an empty draft's (`accept_sampled`: one uniform from the row's generator, by inverse CDF), here
    with the step's uniform drawn in `plan` in the same order and the walk run on the device (`walked_rows`), so the
    streams are the same. A loop step runs no more steps than the live row nearest its budget may still add, so no
    position passes a row's budget (nor so the model's context); tokens past a stop token are cut by the loop, as a
    chunk's always are. Where a step is a CUDA graph replay, the host's share of a token (staging, accept, commit, the
    loop) shrinks by ~`steps`; at one step this policy is the draft-verify step without its per-row drafts, verdicts
    and budget (host work a row a step)."""

    def __init__(self, steps: int = 1) -> None:
        self.steps = self.max_feed = steps  # the last step writes `steps` slots past the committed ones
        self.chunk = steps  # this loop step's count (`plan`)
        self.params = SamplingParams()  # this loop step's (`plan`)
        self.uniforms: list[list[float]] = []  # [slots][chunk]: a sampled chunk's uniforms (`plan`)
        self.drawn: torch.Tensor | None = None  # [n, chunk] on the device: a sampled chunk's tokens (`forward`)

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        pass

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        self.chunk = min(self.steps, 1 + min(budgets))  # budgets[i]: tokens row i may still add beyond one
        self.params, self.drawn, sampled = params, None, self.chunk > 1 and not params.greedy
        with clock("accept"):  # each row's uniforms in its generator's order: one a step, as `accept_sampled` draws
            self.uniforms = [[draft_uniforms(0, g)[0] for _ in range(self.chunk)] for g in generators] \
                if sampled else []
        return [RowStep(seq[-1]) for seq in seqs]  # 1. every live row feeds its last token

    def forward(self, target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
        """2. `chunk` AR forwards over the rows [lo, hi) of `feeds`, nothing committed between them: each runs with its
        rows' lengths advanced past the nodes before it, which stay where the commit keeps them."""
        lo, hi, br = min(feeds), max(feeds) + 1, target.branches
        view = cache.rows(lo * br, hi * br)
        tokens = [[feeds[i][0] if i in feeds else 0] for i in range(lo, hi)]  # [n][1]: the roots
        starts = [[p] for p in view.lengths[::br]]  # [n][1]: their positions
        if self.chunk == 1:  # one step: its inputs from the host (a captured step's one copy), nothing to join
            return Span(view, target.forward(tokens, starts, view, None), (1,) * (hi - lo))  # logits [n, 1, V]
        tokens, starts = host_tensor([tokens, starts], target.device)  # on the device: the picks feed on them
        lengths, outs, drawn = list(view.lengths), [], []
        uniforms = [self.uniforms[i] if i in feeds else [0.0] * self.chunk for i in range(lo, hi)] \
            if self.uniforms else []  # [n][chunk]; a row that sits out draws a padding token
        for j in range(self.chunk):
            view.lengths = [n + j for n in lengths]
            outs.append(target.forward(tokens, starts + j, view, None))
            if uniforms:  # [n, 1]: AR's draw, its walk on the device (a copy: the walk's buffer is reused)
                drawn.append(tokens := walked_rows([Draft.empty()] * (hi - lo), outs[-1].logits[:, -1:], self.params,
                                                   [u[j:j + 1] for u in uniforms], outs[-1].graphs)[:hi - lo].clone())
            elif j + 1 < self.chunk:
                tokens = outs[-1].logits[:, -1:].argmax(-1)  # [n, 1]: AR's greedy pick, left on the device
        view.lengths = lengths
        self.drawn = torch.cat(drawn, 1) if drawn else None  # [n, chunk]
        out = TargetOut(torch.cat([o.logits for o in outs], 1), torch.cat([o.features for o in outs], 1))
        return Span(view, out, (self.chunk,) * (hi - lo), self.chunk)  # logits [n, chunk, V]

    def settle(self, rows, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        with clock("accept"):  # 3. the host's one read of `chunk` tokens a row
            if params.greedy:
                picked = out.picks()  # [n][chunk]
            elif self.drawn is not None:
                picked = self.drawn.tolist()  # [n][chunk]: the draws made on the device
            else:  # chunk 1: each row draws with its own generator's uniform (seeded streams)
                at = [i - lo for i in rows]  # the fed rows of [lo, hi)
                logits = out.logits[:, :1] if len(at) == out.logits.shape[0] else out.logits[at, :1]  # [n, 1, V]
                verdicts = accept_sampled([Draft.empty()] * len(at), logits, params, generators, out.graphs)
                picked = {i: list(v.tokens) for i, v in zip(at, verdicts)}
        for s in stats:
            s.record(0, 0, 0)  # an AR step's record: no draft
        keep = list(range(self.chunk))
        return [(keep, picked[i - lo]) for i in rows]
