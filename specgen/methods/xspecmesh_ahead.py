"""Lossless greedy XSpecMesh with `run_ahead` chain steps a host read: each step's accept, vertex memory and next
chain are made on the device, its rejected nodes hidden (the cache's key mask) until the read commits the kept ones."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.pool import PolicyBase, RowStep
from specgen.decoding.target import Target
from specgen.decoding.verify import Span
from specgen.devices import host_tensor
from specgen.mesh.tokenizers import BPTTokenizer as BPT
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.xspecmesh_pool import XSpecMeshPool
from specgen.models.cache import KVCache
from specgen.models.graphs import masked_call


def token_tables(device) -> tuple[torch.Tensor, torch.Tensor]:
    """[V] each: every token's vertex memory column (`VertexMemory.block_id`, else the trash column: what teaches and
    recalls nothing) and whether it is an offset (`VertexMemory.is_offset`), from the host memory's own rules."""
    host, trash = VertexMemory(), BPT.offset_base
    column = [trash if (b := host.block_id(t)) is None else b for t in range(BPT.vocab_size)]
    offset = [host.is_offset(t) for t in range(BPT.vocab_size)]
    return host_tensor(column, device), host_tensor(offset, device)


@dataclass(frozen=True)
class AheadState:
    """`ChainAhead`'s per-slot state on the device, at fixed addresses (its steps' captures read and write them): the
    next step's tokens (root, chain) and positions [2, C, S] in turns (a step reads one and writes the other, so that
    rerunning it, as a capture's warm-up and replay do, changes nothing), each row's first slot of the loop step
    [C], each step's emitted tokens [C, K, S] and counts [C, K], the vertex memory [C, blocks + 1] (the offset after
    each block, -1: none; the last column, the trash, stays -1); and constants: each token's memory column and
    whether it is an offset [V], the node columns [S] and which pairs come later than which [S, S]."""

    tokens: torch.Tensor
    positions: torch.Tensor
    first: torch.Tensor
    emitted: torch.Tensor
    counts: torch.Tensor
    memory: torch.Tensor
    column: torch.Tensor
    offset: torch.Tensor
    nodes: torch.Tensor
    later: torch.Tensor

    @classmethod
    def allocate(cls, width: int, s: int, steps: int, device) -> "AheadState":
        ints = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)  # noqa: E731
        return cls(ints(2, width, s), ints(2, width, s), ints(width), ints(width, steps, s), ints(width, steps),
                   torch.full((width, BPT.offset_base + 1), -1, dtype=torch.long, device=device),
                   *token_tables(device), torch.arange(s, device=device),
                   torch.ones(s, s, dtype=torch.bool, device=device).triu(1))


class ChainAhead(PolicyBase):
    """XSpecMesh's chain of d candidates, `steps` verify steps a loop step (temperature 0, the lossless rule; the heads
    run ahead inside each verify: `ReadAhead`). Step j of a loop step feeds each row's S = d + 1 nodes into the slots
    [n + j S, n + (j + 1) S) past its committed n, the nodes of earlier steps that their verdicts rejected hidden by
    the cache's key mask: every node sees what the per-step chain's does (the committed slots, the kept nodes before
    it, its own chain), at the positions of the tokens it would have, so its picks are AR's. On the device after each
    step (`advance`): the greedy verdict (the longest prefix of candidates equal to the picks, then the pick after it),
    the tokens it emits, the vertex memory's new pairs (a block token followed by an offset: the latest kept), and the
    next chain (a known block's offset, else the heads' candidate at the accepted node), as the per-step chain's host
    makes them; where the backbone's steps are captured, so is `advance` (one replay a step). The host reads every
    step's tokens once; the loop then commits the kept slots (`settle`'s keep). The key mask stays in the backbone's
    static buffers (all visible between loop steps), so its later steps in the process read one (the same bits)."""

    def __init__(self, pool: XSpecMeshPool, steps: int, vertex: bool) -> None:
        self.pool, self.steps, self.vertex = pool, steps, vertex
        self.d = pool.d
        self.s = self.d + 1
        self.max_feed = steps * self.s  # a loop step's nodes past the committed ones
        self.chunk = steps
        self.graphs = pool.target.model.decoder.graphs  # the backbone's captures, or None
        self.turn = 0  # which of the state's two token and position rows the next step reads

    def open(self, width: int, max_len: int) -> None:
        self.pool.open(width, max_len)
        held = {} if self.graphs is None else self.graphs.held  # kept with the captures that read it
        key = ("chain-ahead", width, self.s, self.steps)
        self.state = held.get(key) or AheadState.allocate(width, self.s, self.steps, self.pool.target.device)
        held[key] = self.state
        self.fresh = [True] * width  # a slot whose next chain the host proposes (just admitted)

    def admit(self, slot: int, index: int, prompt: list[int], first) -> None:
        self.pool.admit(slot, index, prompt, first)
        self.fresh[slot] = True
        self.state.memory[slot] = -1

    def move(self, src: int, dst: int) -> None:
        self.pool.move(src, dst)
        st = self.state
        for t in (st.tokens[self.turn], st.positions[self.turn], st.memory):
            t[dst] = t[src]
        self.fresh[dst] = self.fresh[src]

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        """1. Every live row feeds its last token; a just admitted row's first chain is the host's (the heads on its
        prefill), staged into its slot; the others' are on the device since their last step."""
        self.chunk = min(self.steps, 1 + min(budgets))  # no row's steps pass its budget (each emits >= 1 token)
        self.budgets = list(budgets)
        new = [i for i in range(len(seqs)) if self.fresh[i]]
        if new:
            with clock("propose"):
                drafts = self.pool.propose(seqs, [self.d if i in new else 0 for i in range(len(seqs))], stats)
                tokens, positions = self.state.tokens[self.turn], self.state.positions[self.turn]
                for i in new:  # any chain is lossless: a short one (an EOS candidate) is padded
                    n = len(seqs[i]) - 1  # the root's position: every token before it is committed
                    chain = [*drafts[i].tokens, *[0] * (self.d - drafts[i].size)]
                    staged = host_tensor([[seqs[i][-1], *chain], list(range(n, n + self.s))], tokens.device)  # [2, S]
                    tokens[i], positions[i] = staged[0], staged[1]
                    self.fresh[i] = False
        return [RowStep(seq[-1]) for seq in seqs]

    def forward(self, target: Target, cache: KVCache, feeds: dict[int, tuple[int, Draft]]) -> Span:
        """2. `chunk` verify steps over every live row, none read: step j writes past the slots of the steps before it
        and its `advance` stages the next."""
        n, s, st = len(feeds), self.s, self.state  # every live row is fed: rows [0, n)
        cache.mask_every_slot()  # a step hides its rejected nodes until the read's commit shows every slot again
        view = cache.rows(0, n)
        lengths = list(view.lengths)
        st.first[:n].copy_(host_tensor(lengths, st.first.device))  # each row's first slot of this loop step
        for j in range(self.chunk):
            view.lengths = [m + j * s for m in lengths]
            out = target.forward(st.tokens[self.turn, :n], st.positions[self.turn, :n], view, None)
            step = lambda ahead, j=j, turn=self.turn, mask=view.key_mask: self.advance(turn, j, n, mask, ahead)  # noqa
            # keyed by what a capture bakes in: the held state of this width (`open`), the shapes, step and turn
            key = ("chain-ahead", st.first.shape[0], self.s, self.steps, self.vertex, n, j, self.turn)
            masked_call(self.graphs, view.key_mask, key, step, {"ahead": out.ahead})
            self.turn = 1 - self.turn
        view.lengths = lengths
        self.view = view
        return Span(view, out, (self.chunk * s,) * n, self.chunk)

    def advance(self, turn: int, j: int, n: int, key_mask: torch.Tensor, ahead: torch.Tensor) -> tuple:
        """After step j over rows [0, n) (`ahead` [n, S, 1 + d]: the target's picks, then the heads' candidates at
        each node): its verdicts, emitted tokens and hidden nodes, the vertex memory's new pairs, the next step's
        tokens and positions (state row 1 - `turn`). Device ops only; rerunning it changes nothing."""
        st = self.state
        tokens, positions, col = st.tokens[turn, :n], st.positions[turn, :n], st.nodes  # [n, S], [n, S], [S]
        ids = ahead.long()  # [n, S, 1 + d]: the picks, then the heads' candidates (float32 holds every id exactly)
        picks = ids[..., 0]  # [n, S]
        accepted = (tokens[:, 1:] == picks[:, :-1]).cumprod(1).sum(1)  # [n]: a, the candidates kept
        bonus = picks.gather(1, accepted[:, None])  # [n, 1]: the pick after them
        kept = col <= accepted[:, None]  # [n, S]: the root and the a kept candidates
        emit = torch.where(col < accepted[:, None], tokens.roll(-1, 1), bonus)  # [n, S]: a candidates, then the pick
        advanced = accepted + 1  # [n]: the tokens the step emits
        st.emitted[:n, j] = emit
        st.counts[:n, j] = advanced
        key_mask[:n].scatter_(1, st.first[:n, None] + j * self.s + col, kept)
        heads = ids[:, :, 1 : 1 + self.d].gather(1, accepted[:, None, None].expand(n, 1, self.d))[:, 0]  # [n, d]
        chain = self.recall(torch.cat([tokens[:, :1], emit], 1), kept, bonus[:, 0], heads) if self.vertex else heads
        st.positions[1 - turn, :n] = positions + advanced[:, None]
        st.tokens[1 - turn, :n] = torch.cat([bonus, chain], 1)
        return ()

    def recall(self, seq: torch.Tensor, kept: torch.Tensor, root: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """`VertexMemory.read` of the pairs seq[:, c], seq[:, c + 1] [n, S + 1] that the step kept (`kept` [n, S]:
        each pair's second token), the latest of a block winning, then `VertexMemory.propose` after `root` [n]: each
        candidate a known block's offset, else the heads' `heads` [n, d]."""
        st, trash = self.state, BPT.offset_base
        memory = st.memory[: seq.shape[0]]
        column, after = st.column[seq[:, :-1]], seq[:, 1:]  # [n, S] each
        learn = kept & (column != trash) & st.offset[after]
        same = (column[:, :, None] == column[:, None, :]) & learn[:, None, :] & st.later  # [n, S, S]: a later pair's
        index = torch.where(learn & ~same.any(2), column, trash)
        memory.scatter_(1, index, torch.where(index == trash, -1, after))
        out, prev = [], root
        for c in range(self.d):
            known = memory.gather(1, st.column[prev][:, None])[:, 0]  # [n]: -1 where none (the trash's)
            prev = torch.where(known >= 0, known, heads[:, c])
            out.append(prev)
        return torch.stack(out, 1)

    def settle(self, rows, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        """3. The one host read of every step's tokens; the slots to keep (each step's root and kept candidates) in
        slot order; every slot visible again for the commit."""
        n, k, s, st = len(rows), self.chunk, self.s, self.state
        with clock("accept"):
            host = torch.cat([st.counts[:n, :k], st.emitted[:n, :k].flatten(1)], 1).tolist()  # [n][k + k S]
        self.view.key_mask[:n].fill_(True)
        outcomes, eos = [], self.pool.decoder.eos_id
        for row, stat, budget in zip(host, stats, self.budgets):
            keep, tokens = [], []
            for j, m in enumerate(row[:k]):
                if not 1 <= m <= s:  # a step emits its kept candidates and one pick: else the loop would never end
                    raise RuntimeError(f"run_ahead: step {j} of a loop step emitted {m} tokens (of 1..{s})")
                if len(tokens) <= budget and eos not in tokens:  # a step after the row's end is none of its verifies
                    stat.record(self.d, self.d, m - 1)
                keep += range(j * s, j * s + m)
                tokens += row[k + j * s : k + j * s + m]
            outcomes.append((keep, tokens))
        return outcomes
