"""EAGLE-2 dynamic draft trees from a feature drafter, with CFG; the tree's shape comes from a policy.

The drafter network predicts the target's next feature from (feature f_p, token x_{p+1}) pairs:
`net(features [B, S, D], tokens [B, S], positions [B, S], cache, attn_mask=None) -> hidden [B, S, D]`,
where `positions` are the positions of the tokens (so 2D RoPE sees the token's grid cell), and the
target's LM head turns predicted features into logits. Under CFG the drafter runs both branches
(row 0 cond, row 1 uncond) and its logits are combined with the target's scale, as LANTERN does.

Tree construction (EAGLE-2, `topK_genrate`): 1. run the drafter over the newly committed pairs; the
last output gives the root's children = top-k tokens by log-prob. 2. for depth - 1 levels, feed the
current frontier (k nodes; each sees its ancestors through an explicit mask over the drafter cache),
take top-k children per node, score = parent score + child log-prob, keep the global top-k as the
next frontier (a beam); every candidate is recorded. 3. keep the `total_tokens` best recorded nodes
(plus any missing ancestors) in recording order, which is topological. Drafts are deterministic
(q = 1 at T > 0, lossless with the tree rejection rule) and use raw CFG log-probs, as EAGLE-2 does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut
from specgen.methods.eagle_tree import TreeShape, select_nodes


class ShapePolicy(Protocol):
    """Chooses each tree's shape and learns from its outcome (fixed for EAGLE-2, adaptive for ADT-Tree)."""

    def reset(self) -> None: ...

    def shape(self, next_index: int) -> TreeShape:
        """Shape of the tree drafting the token with sequence index `next_index` onwards."""
        ...

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        """`accepted` draft tokens were accepted; `committed` tokens (accepted + bonus) were added."""
        ...


@dataclass
class FixedShape:
    """EAGLE-2: the same shape for every tree."""

    tree: TreeShape

    def reset(self) -> None:
        pass

    def shape(self, next_index: int) -> TreeShape:
        return self.tree

    def observe(self, next_index: int, shape: TreeShape, accepted: int, committed: int) -> None:
        pass


@dataclass
class EagleTreeDrafter(DrafterBase):
    """Drafter protocol implementation: EAGLE feature drafter + dynamic trees shaped by a policy."""

    net: torch.nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]  # hidden [B, S, D] -> logits [B, S, V] (target's head)
    combine: Callable[[torch.Tensor], torch.Tensor]  # [B, S, V] -> [1, S, V] (CFG or identity)
    policy: ShapePolicy
    max_len: int = 4096
    shapes: list[TreeShape] = field(default_factory=list)  # shape of every proposed tree (stats)

    def pool(self, make: Callable[[int], "EagleTreeDrafter"]):
        """The DrafterPool that grows every live row's tree together (methods/eagle_batch.py)."""
        from specgen.methods.eagle_batch import EagleBatch  # it builds on this module: a top import is a circle

        return EagleBatch(make)

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        self.branches = first.features.shape[0]
        self.cache = self.net.new_cache(self.branches, self.max_len)
        self.pending = first.features[:, -1:]  # [B, 1, D]: f of the last prompt position
        self.policy.reset()
        self.shapes = []
        self.last_shape: TreeShape | None = None

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """CFG-combined log-probs [S, V] of drafter hidden states [B, S, D]."""
        return self.combine(self.head(hidden))[0].float().log_softmax(-1)

    @torch.inference_mode()
    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        m = self.pending.shape[1]
        root_pos = len(seq) - 1  # position of the root token (= its index in seq)
        # 1. catch up: pairs (f_p, x_{p+1}) for the newly committed positions
        toks = torch.tensor([seq[-m:]], device=self.pending.device).expand(self.branches, m)
        pos = torch.arange(root_pos - m + 1, root_pos + 1, device=toks.device).expand(self.branches, m)
        hidden = self.net(self.pending, toks, pos, self.cache)
        for row in range(self.branches):
            self.cache.commit(row, list(range(m)))
        stats.drafter_forwards += 1
        self.last_index = len(seq)
        shape = self.policy.shape(len(seq))
        depth = min(shape.depth, budget)
        self.last_shape = shape
        self.shapes.append(shape)
        if depth <= 0:
            return Draft.empty()
        draft = self.grow(hidden[:, -1:], root_pos, TreeShape(depth, shape.top_k, shape.total_tokens), stats)
        for row in range(self.branches):
            self.cache.rollback(row, self.cache.lengths[row] - self.grown)
        return draft

    def grow(self, root_hidden: torch.Tensor, root_pos: int, shape: TreeShape, stats: DecodeStats) -> Draft:
        """2.-3. Expand the tree level by level in the drafter cache, then select the final nodes."""
        k, device = shape.top_k, root_hidden.device
        lp = self.logprobs(root_hidden)[0]  # [V]
        top = lp.topk(min(k, lp.numel()))
        tokens = top.indices.tolist()
        scores = top.values.tolist()
        parents = [-1] * len(tokens)
        frontier = list(range(len(tokens)))  # recorded ids of the current beam
        frontier_hidden = root_hidden.expand(-1, len(frontier), -1)  # [B, k, D]: predicted f of each parent
        self.grown = 0
        slot_of: dict[int, int] = {}  # recorded id -> drafter cache slot
        for level in range(1, shape.depth):
            base = self.cache.lengths[0]
            mask = self.level_mask(frontier, parents, slot_of, base, device)
            toks = torch.tensor([[tokens[i] for i in frontier]], device=device).expand(self.branches, -1)
            pos = torch.full_like(toks, root_pos + level)
            out = self.net(frontier_hidden, toks, pos, self.cache, attn_mask=mask)  # [B, k, D]
            for j, node in enumerate(frontier):
                slot_of[node] = base + j
            for row in range(self.branches):
                self.cache.commit(row, list(range(len(frontier))))
            self.grown += len(frontier)
            stats.drafter_forwards += 1
            child = self.logprobs(out).topk(min(k, lp.numel()), dim=-1)  # [k, k]
            cand_scores = (torch.tensor([scores[i] for i in frontier], device=device)[:, None] + child.values)
            first_new = len(tokens)
            for j, node in enumerate(frontier):
                tokens += child.indices[j].tolist()
                parents += [node] * child.indices.shape[1]
            scores += cand_scores.flatten().tolist()
            best = cand_scores.flatten().topk(min(k, cand_scores.numel())).indices.tolist()
            frontier = [first_new + b for b in best]
            width = child.indices.shape[1]
            frontier_hidden = out[:, [b // width for b in best]]
        return select_nodes(tokens, parents, scores, shape.total_tokens)

    def level_mask(self, frontier, parents, slot_of, base, device) -> torch.Tensor:
        """[B, 1, S, base + S]: committed prefix, written ancestors, and the node itself."""
        s = len(frontier)
        real = base - self.grown
        mask = torch.zeros(self.branches, 1, s, base + s, dtype=torch.bool, device=device)
        mask[:, :, :, :real] = True
        for j, node in enumerate(frontier):
            mask[:, 0, j, base + j] = True
            anc = parents[node]
            while anc >= 0:
                mask[:, 0, j, slot_of[anc]] = True
                anc = parents[anc]
        return mask

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        rows = [0] + [i + 1 for i in verdict.path]
        self.pending = out.features[:, rows]  # [B, a + 1, D]: f of the root and accepted nodes
        if self.last_shape is not None:
            self.policy.observe(self.last_index, self.last_shape, verdict.num_accepted, len(verdict.tokens))
