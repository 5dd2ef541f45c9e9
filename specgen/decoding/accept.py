"""Pure lossless accept rules: (draft, target distributions) -> Verdict; row 0 is the root, row i + 1 draft node i."""

from __future__ import annotations

from functools import partial
from typing import Sequence

import torch

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.sampling import LazyRows, SamplingParams, inverse_cdf, logits_to_probs
from specgen.decoding.target import Replays
from specgen.devices import to_device
from specgen.models.graphs import NODE_BUCKETS, ROW_BUCKETS


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
                   generators: Sequence[torch.Generator | None], graphs: Replays | None = None) -> list[Verdict]:
    """Lossless tree rejection sampling of deterministic drafts (q = the drafted token's one-hot: SpecInfer's rule for
    siblings) over the target's logits [n, S, V] (S > every draft's size) filtered by `params`.

    The walk tries a node's children in order; child c (token x, parent row r) is tried once its earlier siblings were
    rejected, when the residual is p_r less their tokens, so it is accepted iff u_c * (mass(p_r) - sum of those
    siblings' p_r) < p_r(x). Every node has a uniform of its own, drawn with the last token's from the row's generator
    on the host before the walk (the same draws on every device; a row's draws do not depend on the rows beside it).
    The path is each accepted node that no earlier sibling beat, under a parent on the path; the last token is a draw
    (its uniform, by inverse CDF) from p at the path's end less all its children's tokens (the residual after their
    rejections, or p where none). On a HOST_WALK device a node at a time (`host_walks`), elsewhere every row at once
    (`device_walks`, a replay of the target's `graphs` where given): one upload (tokens, parents, uniforms) and one
    read of N + 1 ints a row, not [S, V] distributions."""
    uniforms = [draft_uniforms(d.size, g) for d, g in zip(drafts, generators)]  # [n][N_i + 1]
    if logits.device.type in HOST_WALK:
        return host_walks(drafts, logits, params, uniforms)
    return device_walks(drafts, logits, params, uniforms, graphs)


def draft_uniforms(size: int, generator: torch.Generator | None) -> list[float]:
    """A judged step's size + 1 uniforms from its row's generator: its nodes', then its last token's. Every lossless
    sampled step draws so (here, and ahead of the step where the device judges: `ArSteps`, `TreeAhead`), so a seed
    gives the same tokens on every path."""
    return torch.rand(size + 1, generator=generator, device=None if generator is None else generator.device).tolist()


def padded(u: list[float], width: int) -> list[float]:
    """A step's uniforms [N + 1] laid out for a walk of `width` nodes: its nodes', zeros, the last one at `width`."""
    return u[:-1] + [0.0] * (width + 1 - len(u)) + u[-1:]


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
                 uniforms: list[list[float]], graphs: Replays | None = None) -> list[Verdict]:
    """Every row at once on the logits' device (`walked_rows`), read in one copy of N + 1 ints a row."""
    out = walked_rows(drafts, logits, params, uniforms, graphs)  # [rows >= n, width + 1]
    n, width = len(drafts), out.shape[1] - 1
    read = (out if out.shape[0] == n else out[:n]).tolist()  # [n][width + 1]: the one read
    verdicts = []
    for d, row in zip(drafts, read):
        path = tuple(c for c in range(d.size) if row[c])  # node order is root-to-leaf order on one path
        verdicts.append(Verdict(path, tuple(d.tokens[c] for c in path) + (row[width],)))
    return verdicts


def walked_rows(drafts: Sequence[Draft], logits: torch.Tensor, params: SamplingParams,
                uniforms: list[list[float]], graphs: Replays | None = None) -> torch.Tensor:
    """The walks of every row on the logits' device, no host read: [rows, width + 1] int64 (rows >= n, width >= S - 1:
    a bucket's, its padding after the real rows and nodes), the path mask over the nodes, then the last token. One
    upload of the tokens, parents and uniforms; with `graphs`, one replay of a (rows, nodes) bucket's captured walk
    (the logits copied into its buffer: ~4 launches where the walk's ops are ~50), eager where no bucket holds the
    call. A replay's result is its graph's buffer: read or copy it before the target's next call."""
    n, s, vocab = logits.shape
    rounds = walk_rounds(max((d.tree.max_depth() for d in drafts), default=0))
    bucket = None if graphs is None else walk_bucket(n, s - 1)
    rows, width = (n, s - 1) if bucket is None else bucket
    x = staged(drafts, uniforms, rows, width)  # [rows, 3, width + 1]
    if bucket is None:
        return walked(logits, to_device(x, logits.device), params, rounds)[0]
    key = ("walk", rows, width, vocab, logits.dtype, params, rounds)
    return graphs.call(key, partial(walked, params=params, rounds=rounds), {"logits": logits, "x": x},
                       {"logits": (rows, width + 1, vocab)})[0]


def walk_bucket(n: int, width: int) -> tuple[int, int] | None:
    """The captured walk's (rows, nodes) bucket of n rows of `width` nodes (an AR step's: none); None: eager."""
    rows = next((r for r in ROW_BUCKETS if r >= n), None)
    nodes = 0 if width == 0 else next((m for m in NODE_BUCKETS if m >= width), None)
    return None if rows is None or nodes is None else (rows, nodes)


def staged(drafts: Sequence[Draft], uniforms: list[list[float]], rows: int, width: int) -> torch.Tensor:
    """The walk's host inputs [rows, 3, width + 1], float32 (it holds ids < 2^24 exactly): node tokens, parent rows
    (-1: padding) and uniforms (column `width`: the last token's), one row a draft, padding rows after them."""
    host = []
    for d, u in zip(drafts, uniforms):
        pad = [0] * (width - d.size)
        host.append([[*d.tokens, *pad, 0], [p + 1 for p in d.tree.parents] + [-1] * (width + 1 - d.size),
                     padded(u, width)])
    host += [[[0] * (width + 1), [-1] * (width + 1), [0.0] * (width + 1)]] * (rows - len(drafts))
    return torch.tensor(host, dtype=torch.float32)


def walked(logits: torch.Tensor, x: torch.Tensor, params: SamplingParams, rounds: int) -> tuple[torch.Tensor]:
    """`walk` over a verify's logits [n, S, V] filtered on the device (no host read: a captured step's) and the staged
    inputs x [n, 3, S] (`staged`) -> [n, S]: the path mask over the S - 1 nodes, then the last token."""
    width = logits.shape[1] - 1
    on, last = device_walk(logits, params, x[:, 0, :width].long(), x[:, 1, :width].long(), x[:, 2], rounds)
    return (torch.cat([on.long(), last[:, None]], 1),)


def device_walk(logits: torch.Tensor, params: SamplingParams, tok: torch.Tensor, parent: torch.Tensor,
                u: torch.Tensor, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`walk` over logits [n, S, V] filtered by `params` without a host read (`host_reads=False`), so that a captured
    step may run it (the walked judge's, `TreeAhead.advance`'s)."""
    return walk(logits_to_probs(logits, params, host_reads=False), tok, parent, u, rounds)


def walk_rounds(depth: int) -> int:
    """`walk`'s pointer-jumping rounds for trees at most `depth` deep: 2^rounds >= depth."""
    return max(depth - 1, 0).bit_length()


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
         rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept_sampled`'s device half, no host read: probs [n, S, V]; node tokens [n, N] and parent rows [n, N] (-1:
    padding; parents precede their children), uniforms [n, N + 1], `rounds` with 2^rounds >= the trees' largest
    depth -> the path mask [n, N] (bool) and the last tokens [n]."""
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
    # on the path: chosen, and every ancestor too. Pointer jumping: after round r, on[c] is the AND over c and its
    # 2^r - 1 nearest ancestor nodes, up[c] the row 2^r levels above c (the root's row stays put)
    on, up = chosen, parent
    for _ in range(rounds):
        on = on & torch.cat([root, on], 1).gather(1, up)
        up = torch.cat([torch.zeros_like(up[:, :1]), up], 1).gather(1, up)
    # the path's end is its largest node (parents precede children); row 0 where the path is empty
    end = torch.cat([torch.zeros_like(root, dtype=torch.long), on * (order + 1)], 1).amax(-1)  # [n]
    p_end = probs[rows, end]  # [n, V]
    gone = torch.where(valid & (parent == end[:, None]), 0.0, float("inf"))  # [n, N]: 0 at the end's children
    residual = p_end.scatter_reduce(1, tok, gone, "amin")  # p_end less its children's tokens, all rejected
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_end)
    return on, inverse_cdf(residual, u[:, width:])
