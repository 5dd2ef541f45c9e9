"""EAGLE-2 trees of every live row grown as tensor programs: per level one drafter forward over all frontiers, then
the beam, the ancestor masks and (once per step) the final node selection, with no Python per node.

Padded layout. Row i has width k_i (its top-k, capped at the vocabulary) and depth d_i. The root's children fill
slots [0, w0) (w0 = the widest row); level L (1 <= L < max depth) feeds a frontier of W_L = max k_i over the rows
still growing (d_i > L), and records its W_L x W_L children (frontier position j, child c) in the next W_L^2 slots.
Slot order is each row's own recording order (methods/eagle.py: a node's children follow its frontier position, in
top-k order), so a row's valid slots, in order, are the nodes its one-row tree records; padding (j or c >= k_i, a row
past its depth) is invalid and scores -inf in the beam, and the first k_i of a sorted beam are the row's own.

Drafter cache. Level L writes its W_L frontier nodes to slots prefix_i + R_{L-1} + j (R_L = W_1 + ... + W_L) of every
row, padding included, and keeps them; the caller rolls every row back to its prefix afterwards. A frontier node sees
the committed prefix, its ancestors' slots and its own (`anc` [n, W, R]: one column per tree slot), so padding sees at
least itself and every query has a key.
"""

from __future__ import annotations

from typing import Callable

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.tree import DraftTree
from specgen.devices import host_tensor
from specgen.methods.eagle_tree import TreeShape

# feats [n*br, W, D], tokens [n*br, W], positions [n*br, W], mask [n*br, 1, W, T] -> hidden [n*br, W, D]; keeps the W
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
LogProbs = Callable[[torch.Tensor], torch.Tensor]  # hidden [n*br, S, D] -> CFG-combined log-probs [n, S, V]


def grow_trees(forward: Forward, logprobs: LogProbs, root_hidden: torch.Tensor, root_pos: list[int],
               prefix: list[int], shapes: list[TreeShape], branches: int) -> tuple[list[Draft], list[int]]:
    """Every row's draft (the `total_tokens` best nodes of its EAGLE-2 tree) and its drafter forwards this step.

    `root_hidden` [n * br, 1, D]: the drafter's output at each root; `root_pos[i]`: the root token's position;
    `prefix[i]`: row i's committed drafter slots (every branch row of a sequence has the same).
    """
    n, br, device = len(shapes), branches, root_hidden.device
    if all(s.depth <= 0 for s in shapes):  # every row's budget ends at the root: no tree to score
        return [Draft.empty() for _ in shapes], [0] * n
    lp = logprobs(root_hidden)[:, 0]  # 1. [n, V]: the root's children
    vocab = lp.shape[-1]
    k = [min(s.top_k, vocab) if s.depth > 0 else 0 for s in shapes]
    depth = [s.depth for s in shapes]
    kk, dd = host_tensor(k, device), host_tensor(depth, device)  # [n] each
    top = lp.topk(max(k), dim=-1)  # [n, w0]
    slots = torch.arange(top.indices.shape[1], device=device)
    parts = [(top.indices, torch.full_like(top.indices, -1), top.values, slots < kk[:, None])]
    width = widest(k, depth, 1)  # W_1: the frontier of level 1 is the best W_1 root children
    f_tok, f_score, f_slot = top.indices[:, :width], top.values[:, :width], slots[:width].expand(n, -1)  # [n, W]
    f_hid = root_hidden.expand(-1, width, -1)  # [n * br, W, D]: the parents' predicted features
    anc = torch.eye(width, dtype=torch.bool, device=device).expand(n, -1, -1)  # [n, W, R]
    recorded, forwards = top.indices.shape[1], [0] * n
    c, rp = host_tensor(prefix, device), host_tensor(root_pos, device)  # [n] each
    for level in range(1, max(depth)):  # 2. one drafter forward per level
        if width == 0:
            break
        live = dd > level  # [n]
        mask = level_mask(anc, c, max(prefix))  # [n, W, T]
        pos = (rp + level * live)[:, None].expand(-1, width)  # a row past its depth stays at its root's position
        out = forward(f_hid, rows(f_tok, br), rows(pos, br), rows(mask, br).unsqueeze(1))  # [n * br, W, D]
        for i in range(n):
            forwards[i] += depth[i] > level
        child = logprobs(out).topk(width, dim=-1)  # [n, W, W] each
        j = torch.arange(width, device=device)
        ok = live[:, None, None] & (j[:, None] < kk[:, None, None]) & (j < kk[:, None, None])  # [n, W, W]
        cand = f_score[:, :, None] + child.values  # [n, W, W]: path scores
        parts.append((child.indices.flatten(1), f_slot[:, :, None].expand(-1, -1, width).flatten(1),
                      cand.flatten(1), ok.flatten(1)))
        nxt = widest(k, depth, level + 1)
        if nxt:  # 3. the beam: each row's best k_i children over its whole frontier (padding scores -inf)
            best = cand.masked_fill(~ok, float("-inf")).flatten(1).topk(nxt, dim=-1)  # [n, W']
            parent = best.indices // width  # [n, W']: frontier position of each new node's parent
            f_tok = child.indices.flatten(1).gather(1, best.indices)
            f_score, f_slot = best.values, recorded + best.indices
            f_hid = out.gather(1, rows(parent, br)[..., None].expand(-1, -1, out.shape[-1]))
            own = torch.eye(nxt, dtype=torch.bool, device=device).expand(n, -1, -1)
            anc = torch.cat([anc.gather(1, parent[..., None].expand(-1, -1, anc.shape[-1])), own], 2)
        recorded += width * width
        width = nxt
    tokens, parents, scores, valid = (torch.cat(p, 1) for p in zip(*parts))  # [n, N] each
    # 4. one read of every row's nodes (float64 holds float32 scores and ids exactly), then each row's best nodes
    host = torch.stack([tokens.double(), parents.double(), scores.double(), valid.double()]).cpu()  # [4, n, N]
    drafts = select_batch(host[0].long(), host[1].long(), host[2], host[3].bool(), [s.total_tokens for s in shapes])
    return [d if s.depth > 0 else Draft.empty() for d, s in zip(drafts, shapes)], forwards


def widest(k: list[int], depth: list[int], level: int) -> int:
    """The frontier width of `level`: the widest row still growing there (0: none is)."""
    return max((ki for ki, d in zip(k, depth) if d > level), default=0)


def rows(x: torch.Tensor, branches: int) -> torch.Tensor:
    """Per-sequence [n, ...] -> per-cache-row [n * br, ...] (each sequence's branches side by side)."""
    return x.repeat_interleave(branches, 0) if branches > 1 else x


def level_mask(anc: torch.Tensor, prefix: torch.Tensor, longest: int) -> torch.Tensor:
    """[n, W, T] bool over drafter slots: the committed prefix, plus the tree slots in `anc` [n, W, R] (slot
    prefix_i + r for column r); T = the longest prefix + R, the keys of this level's forward."""
    _, w, r = anc.shape
    rel = torch.arange(longest + r, device=anc.device)[None] - prefix[:, None]  # [n, T]: slot - the row's prefix
    tree = anc.gather(2, rel.clamp(0, r - 1)[:, None].expand(-1, w, -1)) & ((rel >= 0) & (rel < r))[:, None]
    return tree | (rel < 0)[:, None]


def select_batch(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor,
                 totals: list[int]) -> list[Draft]:
    """`eagle_tree.select_nodes` for every row of the padded layout (host tensors [n, N]): the `totals[i]` best valid
    nodes by (-score, slot) and their ancestors, in slot order, as drafts."""
    n, size = tokens.shape
    key = torch.where(valid, -scores, torch.inf)
    order = key.argsort(dim=1, stable=True)  # [n, N]: ties by slot, as the one-row sort's (-score, id)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(size).expand(n, -1))
    keep = (rank < torch.tensor(totals)[:, None]) & valid  # [n, N]
    up = parents + 1  # [n, N]: column 0 stands for "under the root"
    while True:  # close under parents: a chain of depth d needs d - 1 rounds
        hit = torch.zeros(n, size + 1, dtype=torch.int32).scatter_add_(1, up, keep.int())[:, 1:] > 0
        if not (hit & ~keep).any():
            break
        keep |= hit
    new_id = keep.cumsum(1) - 1  # [n, N]: a kept node's index in its draft
    drafts = []
    for i in range(n):
        kept = keep[i].nonzero().squeeze(1)
        p = parents[i, kept]
        tree = torch.where(p >= 0, new_id[i].gather(0, p.clamp(min=0)), -1)
        drafts.append(Draft(tuple(tokens[i, kept].tolist()), DraftTree(tuple(tree.tolist()))))
    return drafts
