"""Pure lossless accept rules: (draft, target distributions) -> Verdict; row 0 is the root, row i + 1 draft node i."""

from __future__ import annotations

from typing import Sequence

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import LazyRows, SamplingParams, inverse_cdf, logits_to_probs


def accept_greedy(draft: Draft, argmax: list[int]) -> Verdict:
    """Longest path whose every token equals the target's argmax at its parent; argmax [N + 1]."""
    kids, node, path = draft.tree.children, -1, []
    while True:
        want = argmax[node + 1]
        nxt = next((c for c in kids[node + 1] if draft.tokens[c] == want), None)
        if nxt is None:
            return Verdict(tuple(path), tuple(draft.tokens[i] for i in path) + (want,))
        path.append(nxt)
        node = nxt


#: Device types whose rows the walk reads one node at a time, as the host: where the logits live in host memory, a read
#: costs nothing and the walk filters only the rows it visits. Elsewhere (a GPU) every row walks at once on the device.
HOST_WALK = frozenset({"cpu"})


def accept_sampled(drafts: Sequence[Draft], logits: torch.Tensor, params: SamplingParams,
                   generators: Sequence[torch.Generator | None]) -> list[Verdict]:
    """Lossless tree rejection sampling of deterministic drafts (q = the drafted token's one-hot: SpecInfer's rule for
    siblings) over the target's logits [n, S, V] (S > every draft's size) filtered by `params`.

    The walk tries a node's children in order; child c (token x, parent row r) is tried once its earlier siblings were
    rejected, when the residual is p_r less their tokens, so it is accepted iff u_c * (mass(p_r) - sum of those
    siblings' p_r) < p_r(x). Every node has a uniform of its own, drawn with the last token's from the row's generator
    on the host before the walk (the same draws on every device; a row's draws do not depend on the rows beside it).
    The path is each accepted node that no earlier sibling beat, under a parent on the path; the last token is a draw
    (its uniform, by inverse CDF) from p at the path's end less all its children's tokens (the residual after their
    rejections, or p where none). On a HOST_WALK device a node at a time (`host_walks`), elsewhere every row at once
    (`device_walks`): one upload (tokens, parents, uniforms) and one read of N + 1 ints a row, not [S, V]
    distributions."""
    uniforms = [torch.rand(d.size + 1, generator=g, device=None if g is None else g.device).tolist()
                for d, g in zip(drafts, generators)]  # [n][N_i + 1]
    walks = host_walks if logits.device.type in HOST_WALK else device_walks
    return walks(drafts, logits, params, uniforms)


def host_walks(drafts: Sequence[Draft], logits: torch.Tensor, params: SamplingParams,
               uniforms: list[list[float]]) -> list[Verdict]:
    """Each row walked a node at a time (`walk_row`); the roots' rows filtered, and the last tokens drawn, in one
    call each."""
    roots = logits_to_probs(logits[:, 0], params)  # [n, V]: every walk reads its root's row
    walked = [walk_row(d, LazyRows(logits[i], params, {0: roots[i]}), u)
              for i, (d, u) in enumerate(zip(drafts, uniforms))]
    ends = torch.stack([residual for _, residual in walked])  # [n, V]
    lasts = inverse_cdf(ends, torch.tensor([u[-1:] for u in uniforms])).tolist()  # [n]
    return [Verdict(path, tuple(d.tokens[c] for c in path) + (last,))
            for d, (path, _), last in zip(drafts, walked, lasts)]


def device_walks(drafts: Sequence[Draft], logits: torch.Tensor, params: SamplingParams,
                 uniforms: list[list[float]]) -> list[Verdict]:
    """Every row at once on the logits' device (`walk`): one upload of the tokens, parents and uniforms, one read."""
    width = logits.shape[1] - 1  # N: node columns
    host = []  # [n][3][N + 1]: tokens, parent rows (-1: padding), uniforms (column N: the last token's)
    for d, u in zip(drafts, uniforms):
        pad = [0] * (width - d.size)
        host.append([[*d.tokens, *pad, 0], [p + 1 for p in d.tree.parents] + [-1] * (width + 1 - d.size),
                     u[:-1] + pad + u[-1:]])
    x = torch.tensor(host, dtype=torch.float32).to(logits.device)  # float32 holds ids < 2^24 exactly
    depth = max((d.tree.max_depth() for d in drafts), default=0)
    on, last = walk(logits_to_probs(logits, params), x[:, 0, :width].long(), x[:, 1, :width].long(), x[:, 2], depth)
    rows = torch.cat([on.long(), last[:, None]], 1).tolist()  # [n][N + 1]: the one read
    verdicts = []
    for d, row in zip(drafts, rows):
        path = tuple(c for c in range(d.size) if row[c])  # node order is root-to-leaf order on one path
        verdicts.append(Verdict(path, tuple(d.tokens[c] for c in path) + (row[width],)))
    return verdicts


def walk_row(draft: Draft, rows: LazyRows, u: list[float]) -> tuple[tuple[int, ...], torch.Tensor]:
    """`accept_sampled`'s walk of one row, a node at a time: rows[r] is row r's filtered distribution [V] (made when
    first read), u the row's uniforms [N + 1] -> the path and the distribution [V] its last token is drawn from."""
    node, path = -1, []
    while True:
        p, kids = rows[node + 1], draft.tree.children[node + 1]
        mass, before, tried = float(p.sum()) if kids else 1.0, 0.0, []
        for c in kids:
            p_x = float(p[draft.tokens[c]])
            if p_x > 0 and u[c] * (mass - before) < p_x:
                path.append(c)
                node = c
                break
            before += p_x
            tried.append(draft.tokens[c])
        else:
            if not tried:
                return tuple(path), p
            residual = p.index_fill(0, torch.tensor(tried, dtype=torch.long), 0.0)
            return tuple(path), residual if float(residual.sum()) > 0 else p


def walk(probs: torch.Tensor, tok: torch.Tensor, parent: torch.Tensor, u: torch.Tensor,
         depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept_sampled`'s device half, no host read: probs [n, S, V]; node tokens [n, N] and parent rows [n, N] (-1:
    padding; parents precede their children), uniforms [n, N + 1], the trees' largest depth -> the path mask
    [n, N] (bool) and the last tokens [n]."""
    n, s, vocab = probs.shape
    width = s - 1
    rows = torch.arange(n, device=probs.device)
    if width == 0:  # AR's step: no node, the draw from p
        return torch.zeros(n, 0, dtype=torch.bool, device=probs.device), inverse_cdf(probs[:, 0], u)
    valid, parent = parent >= 0, parent.clamp_min(0)
    p_x = probs.reshape(n, s * vocab).gather(1, parent * vocab + tok) * valid  # [n, N]: p_parent(x)
    mass = probs.sum(-1).gather(1, parent)  # [n, N]: the parent row's total (~1 after filtering)
    order = torch.arange(width, device=probs.device)
    earlier = (parent[:, :, None] == parent[:, None, :]) & (order[None, :] < order[:, None]) & valid[:, None, :]
    before = torch.where(earlier, p_x[:, None, :], 0.0).sum(-1)  # [n, N]: the earlier siblings' mass
    accepted = valid & (p_x > 0) & (u[:, :width] * (mass - before) < p_x)  # [n, N]: u_c < p'(x_c)
    chosen = accepted & ~(earlier & accepted[:, None, :]).any(-1)  # [n, N]: its parent's first accepted child
    root = torch.ones(n, 1, dtype=torch.bool, device=probs.device)
    on = chosen
    for _ in range(depth - 1):  # pass k settles depth k + 2
        on = chosen & torch.cat([root, on], 1).gather(1, parent)
    # the path's end is its largest node (parents precede children); row 0 where the path is empty
    end = torch.cat([torch.zeros_like(root, dtype=torch.long), on * (order + 1)], 1).amax(-1)  # [n]
    p_end = probs[rows, end]  # [n, V]
    gone = torch.where(valid & (parent == end[:, None]), 0.0, float("inf"))  # [n, N]: 0 at the end's children
    residual = p_end.scatter_reduce(1, tok, gone, "amin")  # p_end less its children's tokens, all rejected
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_end)
    return on, inverse_cdf(residual, u[:, width:])
