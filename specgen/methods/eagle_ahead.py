"""Lossless EAGLE trees with `run_ahead` tree steps a host read: each step's drafter catch-up, growth, verdict (greedy
or sampled) and next pairs made on the device, its rejected nodes hidden (the target cache's key mask) until the read
commits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from specgen.decoding.accept import device_walk, draft_uniforms, padded, walk_rounds
from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import judge
from specgen.decoding.pool import PolicyBase, RowStep
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import Target, TargetOut
from specgen.decoding.verify import Span
from specgen.devices import host_tensor
from specgen.errors import UsageError
from specgen.methods.eagle import EagleBatch, EagleTreeDrafter
from specgen.methods.eagle_grow import GrowPlan, TreeShape, branch_rows, kept_counts, static_growth
from specgen.methods.options import check_ahead
from specgen.models.cache import KVCache
from specgen.models.graphs import masked_call
from specgen.models.static_step import StaticInputs, eagle_step


@dataclass
class AheadTreeDrafter(EagleTreeDrafter):
    """An EAGLE drafter whose rows run `run_ahead` tree steps a host read (`TreeAhead`), under the lossless rule."""

    run_ahead: int = 2

    def step_policy(self, make: Callable[[int], EagleTreeDrafter], target, rule, budget) -> "TreeAhead":
        if rule is not judge:
            raise UsageError("run_ahead (option of eagle2, adt-tree) needs the lossless rule")
        return TreeAhead(EagleBatch(make, self.policy.largest.total_tokens), self.run_ahead, target)


@dataclass(frozen=True)
class TreeState:
    """`TreeAhead`'s per-slot state on the device, at fixed addresses (its steps' captures read and write them), the
    next step's part in two turns (a step reads one and writes the other, so that rerunning it, as a capture's
    warm-up and replay do, changes nothing): the drafter's pending pairs (f_p, x_{p+1}), their features
    [2, C br, M, D] and tokens [2, C, M], and per row [2, 3, C] their count m, the first one's position and the
    drafter's committed slots (the root is the last pair's token, at the last pair's position); each row's first
    target slot of the loop step [C] and tree shape ints [3, C] (top-k, depth, kept nodes); the last growth's verify
    tokens [C, N] and tree mask [C, N, N] (N: the most nodes a step verifies, its root's included; `advance` reads
    them); each step's emitted tokens and kept nodes [C, K, M] and emitted counts [C, K]; sampled, each step's
    uniforms [C, K, N] (`plan`: a row's node uniforms, then its last token's at column S - 1 of the step's S)."""

    features: torch.Tensor
    tokens: torch.Tensor
    ints: torch.Tensor
    first: torch.Tensor
    shape: torch.Tensor
    tree_tokens: torch.Tensor
    tree_mask: torch.Tensor
    emitted: torch.Tensor
    path: torch.Tensor
    counts: torch.Tensor
    uniforms: torch.Tensor

    @classmethod
    def allocate(cls, width: int, branches: int, m: int, nodes: int, dim: int, steps: int, dtype,
                 device) -> "TreeState":
        ints = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)  # noqa: E731
        return cls(torch.zeros(2, width * branches, m, dim, dtype=dtype, device=device), ints(2, width, m),
                   ints(2, 3, width), ints(width), ints(3, width), ints(width, nodes),
                   torch.zeros(width, nodes, nodes, dtype=torch.bool, device=device), ints(width, steps, m),
                   ints(width, steps, m), ints(width, steps),
                   torch.zeros(width, steps, nodes, dtype=torch.float32, device=device))


class TreeAhead(PolicyBase):
    """EAGLE-2's or ADT-Tree's trees, `steps` tree steps a loop step (the lossless rule, greedy or sampled), on a
    drafter and target with captured (or static: `graphs.attach`) steps. Step j of a loop step: 1. the drafter's
    catch-up over the pending pairs of step j - 1 (a fixed M = the deepest tree + 1 columns, the real m first: the
    next ones go to slot prefix + m, over the padding) and its tree growth in one drafter replay; 2. the target's
    verify of the tree in the slots [n + j S, n + (j + 1) S) past the committed n, the nodes that earlier steps
    rejected hidden by the cache's key mask: every node sees what the per-step tree's does, at its positions, so its
    picks are AR's; 3. `advance` (one target replay): the greedy verdict (the accepted path: a node whose parent is
    on it and whose token is the parent's pick), the tokens it emits, its rejected nodes hidden, and the next pending
    pairs (the path's features and the tokens after them). The host reads every step's tokens and paths once; the
    loop then commits the kept slots. Each row's tree shape stays fixed over a loop step (ADT-Tree adapts between
    them: `observe` after the read). Sampled, the verdict is `accept_sampled`'s walk (`accept.device_walk`) over
    uniforms each row drew in `plan`, in the order and number the per-step judge draws them, so a seed gives its
    tokens."""

    def __init__(self, pool: EagleBatch, steps: int, target: Target) -> None:
        first = pool.make(0)
        self.pool, self.steps, self.net_graphs = pool, steps, first.net.graphs
        self.target_graphs = target.model.graphs
        if self.net_graphs is None or self.target_graphs is None:
            raise UsageError("run_ahead (option of eagle2, adt-tree) needs captured steps on the drafter and the "
                             "target: --graphs on or auto, on a CUDA device")
        largest = first.policy.largest
        self.m = largest.depth + 1  # a step's pending pairs: the root and at most `depth` accepted nodes
        self.nodes = 1 + largest.total_tokens  # the most nodes a step verifies
        self.max_feed = steps * self.nodes  # a loop step's nodes past the committed ones
        self.chunk = steps
        self.turn = 0
        self.state: TreeState | None = None
        self.params = SamplingParams()  # the loop step's (`plan`)

    def open(self, width: int, max_len: int) -> None:
        self.pool.open(width, max_len)
        self.width = width
        self.prompt_lengths = [0] * width  # each slot's, from its admission to its start

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        self.pool.admit(slot, index, prompt, first)
        pool = self.pool
        if self.state is None:
            graphs = self.net_graphs
            # kept with the captures that read it: the drafter's and the target's (either's reset keeps it for the
            # other's captures; the state's identity keys them)
            key = ("tree-ahead", self.width, pool.br, self.m, self.nodes, self.steps)
            self.state = graphs.held.get(key) or self.target_graphs.held.get(key) or TreeState.allocate(
                self.width, pool.br, self.m, self.nodes, pool.net.cfg.dim, self.steps, pool.net.fc.weight.dtype,
                graphs.device)
            graphs.held[key] = self.target_graphs.held[key] = self.state
            self.held = (*key[1:], id(self.state))
        self.prompt_lengths[slot] = len(prompt)

    def start(self, slot: int, first: TargetOut, params, generator, stats) -> list[int]:
        """The first token from the prefill (`PolicyBase.start`), and the row's first pending pair: (f of the
        prompt's last position, that token) at the token's position, none of the drafter's slots committed."""
        check_ahead(self.steps, "fixed")  # the options' rule, for callers that skip their check
        tokens = super().start(slot, first, params, generator, stats)
        st, br, t = self.state, self.pool.br, self.turn
        st.features[t, slot * br : (slot + 1) * br, 0] = first.features[:, -1]  # [br, D]: the prompt's last f
        st.tokens[t, slot, 0] = tokens[0]
        st.ints[t, :, slot] = host_tensor([1, self.prompt_lengths[slot], 0], st.ints.device)
        return tokens

    def move(self, src: int, dst: int) -> None:
        self.pool.move(src, dst)
        st, br, t = self.state, self.pool.br, self.turn
        st.features[t, dst * br : (dst + 1) * br] = st.features[t, src * br : (src + 1) * br]
        st.tokens[t, dst] = st.tokens[t, src]
        st.ints[t, :, dst] = st.ints[t, :, src]

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        """1. Each row's tree shape for the loop step (its policy's at the row's length), staged on the device; the
        pending pairs are there since the last step. As many steps as keep every tree inside every row's budget (a
        step emits at most depth + 1 tokens; nodes past the budget would be past the model's positions): near the end
        one step, its depths cut to the budgets (0: the root alone, as a batched AR step)."""
        n = len(seqs)
        self.budgets = list(budgets)
        with clock("propose"):
            shapes = [d.policy.shape(len(seq)) for d, seq in zip(self.pool.rows, seqs)]
            self.chunk = min(self.steps, *((b + 1) // (s.depth + 1) for b, s in zip(budgets, shapes)))
            cut = self.chunk < 1
            self.chunk = max(self.chunk, 1)
            self.shapes = [TreeShape(min(s.depth, b) if cut else s.depth, s.top_k, s.total_tokens)
                           for s, b in zip(shapes, budgets)]
            for d, seq, shape, own in zip(self.pool.rows, seqs, self.shapes, shapes):
                d.last_index, d.last_shape = len(seq), own if shape.depth > 0 else None  # observed after the read
            k = [min(s.top_k, self.pool.vocab) if s.depth > 0 else 0 for s in self.shapes]
            depth = [s.depth for s in self.shapes]
            self.counts = kept_counts(k, depth, [s.total_tokens for s in self.shapes])
            # every row's at least one level (a row of depth 0 is padding in it: k 0)
            self.plan_ = GrowPlan.bucketed([max(x, 1) for x in k], [replace(s, depth=max(s.depth, 1))
                                                                    for s in self.shapes], self.pool.vocab)
            self.state.shape[:, :n] = host_tensor([k, depth, self.counts], self.state.shape.device)
        self.params = params
        if not params.greedy:
            with clock("accept"):
                self.stage_uniforms(generators)
        return [RowStep(seq[-1]) for seq in seqs]

    def stage_uniforms(self, generators) -> None:
        """Each row's uniforms for the loop step's trees, drawn from its generator as the per-step judge draws them
        (`accept_sampled`: N + 1 a step, its N nodes' and the last token's), staged at the state's fixed address."""
        s = 1 + max(self.counts)
        host = [[padded(draft_uniforms(c, g), s - 1) for _ in range(self.chunk)]
                for g, c in zip(generators, self.counts)]
        self.state.uniforms[:len(host), :self.chunk, :s] = host_tensor(host, self.state.uniforms.device)

    def forward(self, target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
        """2. `chunk` tree steps over every live row, none read: step j's drafter replay, verify and `advance`."""
        n, st, br, pool = len(feeds), self.state, self.pool.br, self.pool
        s = 1 + max(self.counts)  # a step's nodes a row: its root and the fullest row's tree
        cache.mask_every_slot()  # a step hides its rejected nodes until the read's commit shows every slot again
        view = cache.rows(0, n * br)
        lengths = list(view.lengths)
        st.first[:n].copy_(host_tensor(lengths[::br], st.first.device))
        graphs = self.net_graphs
        # the drafter slots a loop step reaches: every step's M pairs and the last one's levels
        slots = max(pool.cache.lengths[: n * br]) + self.chunk * self.m + sum(self.plan_.widths[1:])
        if slots > graphs.k.shape[3] or pool.cache.k.data_ptr() != graphs.k.data_ptr():
            raise RuntimeError(f"run_ahead: the drafter's static cache ({graphs.k.shape[3]} slots) cannot hold "
                               f"{slots}")
        width = graphs.width(slots)
        for j in range(self.chunk):
            key = ("tree-ahead", *self.held, n, pool.children.scale, self.plan_, width, self.turn)
            grown = graphs.call(key, lambda turn=self.turn: self.draft(turn, n, width), {})
            view.lengths = [m + j * s for m in lengths]
            tokens, positions, mask = (x[:, :s] if x.dim() == 2 else x[:, :s, :s] for x in grown[2:])
            out = target.forward(tokens, positions, view, mask)
            inputs = {"logits": out.logits, "features": out.features}
            step = lambda turn=self.turn, j=j, mask=view.key_mask, **x: self.advance(turn, j, n, s, mask, **x)  # noqa
            key = ("tree-ahead", *self.held, n, s, j, self.turn, self.params, self.rounds())
            masked_call(self.target_graphs, view.key_mask, key, step, inputs)
            self.turn = 1 - self.turn
        view.lengths = lengths
        self.view, self.s = view, s
        return Span(view, out, (self.chunk * s,) * n, self.chunk)

    def draft(self, turn: int, n: int, width: int) -> tuple[torch.Tensor, ...]:
        """Step 1 over rows [0, n) from state row `turn`: the catch-up over the pending pairs (written at each row's
        committed drafter slots, the next prefix after its m real ones: state row 1 - `turn`), the roots (the last
        real pair's output) and the growth over them: `static_growth`'s outputs. Device ops only."""
        st, pool, br = self.state, self.pool, self.pool.br
        graphs, rows, m_cols = self.net_graphs, n * br, self.m
        m, start, prefix = st.ints[turn, :, :n]  # [n] each
        on = st.ints.device
        # a loop step's steps stay inside `width` (`forward`); a replay after the run (a profile's) may not: clamped,
        # its writes and reads stay inside the slots it reads (no kernel reads past a buffer)
        prefix = prefix.clamp(max=width - m_cols - sum(self.plan_.widths[1:]))
        cols = torch.arange(m_cols, device=on)
        # [n, M]: padding pairs at the last's; inside the RoPE table: a loop step's trees are (`plan`), a replay after
        # the run may start past its end (a last step's tokens past the budget)
        end = pool.net.rope_table.shape[0] - 1
        positions = (start[:, None] + torch.minimum(cols, (m - 1)[:, None])).clamp(max=end)
        x = StaticInputs(branch_rows(st.tokens[turn, :n], br), branch_rows(positions, br),
                         torch.stack([branch_rows(prefix, br), torch.arange(rows, device=on)]),
                         torch.ones(m_cols, m_cols, dtype=torch.bool, device=on).tril().expand(rows, -1, -1),
                         features=st.features[turn, :rows])
        hidden = eagle_step(pool.net, x, graphs.k, graphs.v, None, width)[0]  # [rows, M, D]
        last = branch_rows(m - 1, br)  # [rows]: each row's last real pair
        roots = hidden.gather(1, last[:, None, None].expand(rows, 1, hidden.shape[-1]))  # [rows, 1, D]
        root = st.tokens[turn, :n].gather(1, (m - 1)[:, None])[:, 0]  # [n]: the last pair's token
        k, depth, counts = st.shape[:, :n]
        at = torch.minimum(start + m - 1, end - depth)  # [n]: the root's position (a loop step's: its own)
        ints = torch.stack([at, k, depth, counts, prefix + m, root])  # [6, n]: `grow`'s
        st.ints[1 - turn, 2, :n] = prefix + m
        grown = static_growth(pool.net, pool.children, (graphs.k, graphs.v), self.plan_, br, width, roots, ints,
                              torch.arange(rows, device=on))
        s = grown[2].shape[1]  # the growth's verify width (its kept nodes' and the root)
        st.tree_tokens[:n, :s] = grown[2]  # for `advance`: inside this replay, no launch of its own
        st.tree_mask[:n, :s, :s] = grown[4]
        return grown

    def advance(self, turn: int, j: int, n: int, s: int, key_mask: torch.Tensor, logits: torch.Tensor,
                features: torch.Tensor) -> tuple:
        """Step 3 over rows [0, n): from the verify's logits [n, S, V] and features [n br, S, D] and the growth's
        tokens [n, S] and tree mask [n, S, S] (each node's ancestors, the root among them, and itself:
        `tree_inputs`), the verdict, the tokens emitted, the nodes hidden and the next pending pairs (state row
        1 - `turn`). Device ops only; rerunning it changes nothing."""
        st, br, mc = self.state, self.pool.br, self.m
        tokens, seen = st.tree_tokens[:n, :s], st.tree_mask[:n, :s, :s]  # [n, S], [n, S, S]
        on = tokens.device
        depth = seen.sum(2) - 1  # [n, S]: a padding node sees itself alone (depth 0, as the root)
        parent = (seen & (depth[:, None, :] == depth[:, :, None] - 1)).int().argmax(2)  # [n, S]: the root's 0
        real = torch.arange(s, device=on) <= st.shape[2, :n, None]  # [n, S]: the root and the row's kept nodes
        if self.params.greedy:
            picks = logits.argmax(-1)  # [n, S]
            match = real & ((tokens == picks.gather(1, parent)) | (depth == 0))  # [n, S]: its parent's pick, or root
            on_path = ~(seen & ~match[:, None, :]).any(2)  # [n, S]: itself and every ancestor matched
        else:  # the sampled judge's walk: its nodes' parents (-1: padding) and the loop step's uniforms
            node_parent = torch.where(real[:, 1:], parent[:, 1:], -1)  # [n, S - 1]
            walked, last = device_walk(logits, self.params, tokens[:, 1:], node_parent, st.uniforms[:n, j, :s],
                                       self.rounds())
            on_path = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=on), walked], 1)  # [n, S]: root, path
        levels = torch.arange(mc, device=on)
        at = on_path[:, None, :] & (depth[:, None, :] == levels[None, :, None])  # [n, M, S]: the path node at depth d
        path = at.int().argmax(2)  # [n, M]: its node (0 past the path's end)
        accepted = on_path.sum(1) - 1  # [n]: a
        # [n, 1]: the pick at the path's last node, or the walk's last draw
        bonus = picks.gather(1, path.gather(1, accepted[:, None])) if self.params.greedy else last[:, None]
        after = tokens.gather(1, torch.cat([path[:, 1:], path[:, :1]], 1))  # [n, M]: the node after depth d's
        emit = torch.where(levels < accepted[:, None], after, bonus)  # [n, M]: a path tokens, then the pick
        st.emitted[:n, j] = emit
        st.path[:n, j] = path
        st.counts[:n, j] = accepted + 1
        slots = st.first[:n, None] + j * s + torch.arange(s, device=on)  # [n, S]
        key_mask[: n * br].scatter_(1, branch_rows(slots, br), branch_rows(on_path, br))
        rows_path = branch_rows(path, br)  # [n br, M]
        st.features[1 - turn, : n * br] = features.gather(1, rows_path[..., None].expand(-1, -1, features.shape[-1]))
        st.tokens[1 - turn, :n] = emit
        m, start = st.ints[turn, 0, :n], st.ints[turn, 1, :n]
        st.ints[1 - turn, 0, :n] = accepted + 1
        st.ints[1 - turn, 1, :n] = start + m
        return ()

    def rounds(self) -> int:
        """The sampled walk's pointer-jumping rounds for the loop step's trees (`accept.walk_rounds`)."""
        return walk_rounds(max(s.depth for s in self.shapes))

    def settle(self, rows, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        """3. The one host read of every step's tokens, kept nodes and the drafter's committed slots; the slots to
        keep in slot order; every slot visible again for the commit; each row's policy observes its steps."""
        n, k, s, st, mc, br = len(rows), self.chunk, self.s, self.state, self.m, self.pool.br
        with clock("accept"):
            host = torch.cat([st.counts[:n, :k], st.emitted[:n, :k].flatten(1), st.path[:n, :k].flatten(1),
                              st.ints[self.turn, 2, :n, None]], 1).tolist()  # [n][k + 2 k M + 1]
        self.view.key_mask[: n * br].fill_(True)
        drafter = self.pool.cache
        outcomes = []
        for i, (row, stat, budget, shape) in enumerate(zip(host, stats, self.budgets, self.shapes)):
            keep, tokens = [], []
            d = self.pool.rows[i]
            for j, c in enumerate(row[:k]):
                if not 1 <= c <= mc:  # a step emits its accepted nodes and one pick: else the loop would never end
                    raise RuntimeError(f"run_ahead: step {j} of a loop step emitted {c} tokens (of 1..{mc})")
                if len(tokens) <= budget:  # a step after the row's end is none of its verifies
                    stat.record(self.counts[i], shape.depth, c - 1)
                    stat.drafter_forwards += max(shape.depth, 1)  # the catch-up, then a forward a later level
                    if d.last_shape is not None:
                        d.policy.observe(d.last_index + len(tokens), d.last_shape, c - 1, c)
                base = k + j * mc
                keep += [j * s + p for p in row[k * (1 + mc) + j * mc : k * (1 + mc) + j * mc + c]]
                tokens += row[base : base + c]
            drafter.lengths[i * br : (i + 1) * br] = [row[-1]] * br
            outcomes.append((keep, tokens))
        return outcomes
