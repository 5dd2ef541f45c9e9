"""XSpecMesh as a DrafterPool of the batched loop: per-row head candidates, the paper's rules as the loop's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specgen.decoding.accept import accept_rejection
from specgen.decoding.accept_threshold import AcceptCriterion, accept_lossy
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.pool import PoolBase
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut


class LazyRows:
    """Filtered, tempered distributions of logits rows [S, V], computed only when the rule reads them
    (it stops at the first rejection, so later rows never pay the top-k / top-p filter)."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams) -> None:
        self.logits, self.params, self.rows = logits, params, {}

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = logits_to_probs(self.logits[i], self.params)  # [V]
        return self.rows[i]


def mesh_rule(opts):
    """The loop's accept rule for a chain of candidates x_{s+1 ..} on the backbone's filtered rows [D + 1, V]:
    lossless rejection sampling (deterministic candidates: q = one-hot, accept with probability p(x)), or the paper's
    lossy criterion."""
    criterion = None if opts.lossless else AcceptCriterion(opts.criterion, opts.delta, opts.top_k_accept)

    def rule(draft: Draft, logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        if criterion is None:
            return accept_rejection(draft, LazyRows(logits, params), generator)
        return accept_lossy(draft, LazyRows(logits, params), criterion, generator, params.greedy)

    return rule


@dataclass
class RowState:
    """What one mesh carries between steps."""

    h: torch.Tensor  # [1, dim]: h_{s*-1}
    past: torch.Tensor | None  # history heads' window
    head_kv: object  # the heads' K/V of this row's point cloud
    memory: object | None  # VertexMemory (vertex_lookup)
    generator: torch.Generator | None  # candidate stream


class XSpecMeshPool(PoolBase):
    """Head candidates for every live mesh; `decoder` is the MeshDecoder whose heads and helpers it uses."""

    def __init__(self, decoder, target, opts, params: SamplingParams, d_max: int,
                 draft_generators: Sequence[torch.Generator | None]) -> None:
        self.decoder, self.target, self.opts, self.params, self.d = decoder, target, opts, params, d_max
        self.draft_generators = draft_generators
        self.stacked = decoder.heads.stacked()  # all D heads as one batched op per layer
        if decoder.heads.graphs is not None:  # its captures read an earlier pool's stacked weights
            decoder.heads.graphs.reset()

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        dec, cond = self.decoder, self.target.conditions[index]
        h = first.features[0, -1:]  # [1, dim]: the start's hidden state
        memory = dec._vertex_memory() if self.opts.vertex_lookup else None
        self.rows[slot] = RowState(h, dec._window(self.stacked, h, None),
                                   self.stacked.context_kv(dec.heads.context_kv(cond)), memory,
                                   self.draft_generators[index])

    def propose(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats]) -> list[Draft]:
        """1. x_{s*+1 ..} after each row's root x_{s*} = seq[-1] (seq = [cloud index] + the mesh so far)."""
        drafts = []
        for r, seq, budget in zip(self.rows, seqs, budgets):
            if budget <= 0:  # the loop's budget runs this step as AR: the heads are not run at all
                drafts.append(Draft.empty())
                continue
            mesh, x = seq[1:-1], seq[-1]
            proposal = self.decoder._candidates(mesh, x, self.stacked, r.h, r.past, r.head_kv, self.d, self.params,
                                                self.opts, r.generator, r.memory)
            chain = proposal.cut(self.opts.min_path_prob)
            eos = self.decoder.eos_id
            if eos in chain:  # nothing after an EOS candidate
                chain = chain[: chain.index(eos) + 1]
            drafts.append(Draft.chain(chain[: max(0, budget)]))
        return drafts

    def on_accept(self, drafts: Sequence[Draft], verdicts: Sequence[Verdict], out: TargetOut,
                  sizes: Sequence[int], branches: int) -> None:
        """5. h_{s*-1} and the history window after committing x_s .. x_{s*-1}."""
        for i, (r, verdict) in enumerate(zip(self.rows, verdicts)):
            a = verdict.num_accepted
            hidden = out.features[i, : sizes[i]]  # [S_i, dim]
            r.past = self.decoder._window(self.stacked, hidden[: a + 1], r.past)
            r.h = hidden[a : a + 1]
