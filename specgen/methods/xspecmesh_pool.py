"""XSpecMesh as a DrafterPool of the batched loop: per-row head candidates (draws, path cut), the paper's rules."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from itertools import accumulate
from typing import Sequence

import torch

from specgen.decoding.accept_threshold import AcceptCriterion, accept_lossy
from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.draft_verify import judge
from specgen.decoding.pool import PoolBase
from specgen.decoding.sampling import LazyRows, SamplingParams, logits_to_probs, sample, sample_rows
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut
from specgen.devices import copy_into, host_tensor
from specgen.errors import UsageError
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.options import XSpecMeshOptions
from specgen.models.graphs import ROW_BUCKETS
from specgen.models.heads import StackedHeads, head_logits

#: Precision of the heads' LM-head projection (candidates only; the backbone, hence acceptance, stays float32):
#: float32 by default, as the head bodies always (docs/results/mesh.md).
DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Branches of the top-K_s probability tree lighter than this are pruned (appendix A.4).
TREE_PRUNE = 1e-5
#: Device types on which a host read idles the device (the host waits, then launches the next work), so lossless greedy
#: decoding reads the heads' candidates for every verify position with the judge's picks (one call, D + 1 times their
#: work: `reads_ahead`). Elsewhere the heads run once per row in `propose`, read on their own.
ONE_READ = frozenset({"cuda"})


def reads_ahead(device: torch.device | str, params: SamplingParams, opts: XSpecMeshOptions,
                stacked: StackedHeads) -> bool:
    """Whether the heads run ahead inside each verify forward (`ReadAhead`), read with the accept's picks
    (`DraftVerify`'s `along`): the batched greedy judge reads every verify position's argmax, the x_{s*} of each
    length it may accept. Not for history heads: each position's window differs in length until it is full, so the
    positions are no one call."""
    return params.greedy and opts.lossless and not stacked.history and (
        torch.device(device).type in ONE_READ or opts.run_ahead > 1)  # `ChainAhead` reads the heads from the device


@dataclass(frozen=True)
class Proposal:
    """Candidates x_{s*+1 ..} and the probability their proposer gave each (a head's tempered softmax; lookup: 1)."""

    tokens: list[int]
    probs: list[float]

    @classmethod
    def of_columns(cls, col: list[float], d: int, width: int = 1) -> "Proposal":
        """From a host row of `greedy_columns` [d w or 2 d]: the token ids (each head's best `width`, head-major),
        then their probabilities (else all 1)."""
        n = d * width
        return cls([int(t) for t in col[:n]], col[n:] or [1.0] * n)

    def cut(self, min_path_prob: float) -> list[int]:
        """The candidates before the first one at which the running product of probs is below min_path_prob."""
        paths = enumerate(accumulate(self.probs, operator.mul))
        return self.tokens[: next((j for j, path in paths if path < min_path_prob), len(self.tokens))]


def tree_sample(probs: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
    """Top-K_s probability-tree sampling over head distributions probs [D, V] -> one path of D tokens."""
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)  # values/indices [D, K]
    (D, kk), weight = top.indices.shape, top.values[0]
    for d in range(1, D):
        weight = (weight.unsqueeze(-1) * top.values[d]).flatten()  # [K^(d+1)], row-major paths
    weight = torch.where(weight >= TREE_PRUNE, weight, torch.zeros_like(weight))
    if not weight.sum() > 0:
        return top.indices[:, 0].tolist()
    flat = sample(weight / weight.sum(), generator)  # a row-major path: head d's choice is its d-th base-K digit
    return [int(top.indices[d, flat // kk ** (D - 1 - d) % kk]) for d in range(D)]


def greedy_columns(head_logits: torch.Tensor, temperature: float, path_probs: bool, width: int = 1) -> torch.Tensor:
    """Each head's most probable token of logits [..., D, V] and (path_probs) its tempered probability, as one float32
    tensor [..., D] or [..., 2 D] (ids are exact in float32): one host read carries both, on the device alone. A
    candidate tree's `width` > 1: each head's best `width` tokens, [..., D * width] (head-major; no probabilities)."""
    if width > 1:
        return head_logits.topk(width, dim=-1).indices.flatten(-2).float()  # [..., D * width]
    tokens = head_logits.argmax(-1)  # [..., D]
    if not path_probs:
        return tokens.float()
    return torch.cat([tokens.float(), token_probs(head_logits, tokens, temperature)], -1)


def token_probs(head_logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each head's tempered probability [..., D] of its token tokens [..., D] under logits [..., D, V]."""
    scaled = head_logits / (temperature or 1.0)
    return (scaled.gather(-1, tokens[..., None])[..., 0] - scaled.logsumexp(-1)).exp()


def greedy_draft(params: SamplingParams, opts: XSpecMeshOptions) -> bool:
    """Whether the candidates are every head's most probable token (`greedy_columns`): greedy, or the K_s = 1 tree
    (its one path is every head's argmax, and the filters keep each row's max)."""
    return params.greedy or (opts.sampling == "tree" and opts.top_k_tree == 1)


def head_candidates(head_logits: torch.Tensor, params: SamplingParams, opts: XSpecMeshOptions,
                    generator: torch.Generator | None) -> Proposal:
    """Sampled candidates x_{s*+1 .. s*+D} from head logits [D, V], and each head's tempered probability of its token
    (for `min_path_prob`); a `greedy_draft` takes `greedy_columns` instead, computed with the heads."""
    if opts.sampling == "tree":
        tokens = tree_sample(logits_to_probs(head_logits, params), opts.top_k_tree, generator)
    else:
        tokens = sample_rows(logits_to_probs(head_logits, params), generator)  # one independent draw per head
    if not opts.min_path_prob:
        return Proposal(tokens, [1.0] * len(tokens))
    chosen = host_tensor(tokens, head_logits.device)  # [D]
    return Proposal(tokens, token_probs(head_logits, chosen, params.temperature).tolist())


def mesh_rule(opts: XSpecMeshOptions, params: SamplingParams):
    """The loop's accept rule for a chain of candidates x_{s+1 ..} on the backbone's filtered rows [D + 1, V]:
    lossless rejection sampling (deterministic candidates: q = one-hot, accept with probability p(x); greedy: the
    argmax match) as the loop's batched `judge` (one host copy a step for the whole batch), or the paper's lossy
    criterion."""
    if opts.lossless:
        return judge
    criterion = AcceptCriterion(opts.criterion, opts.delta, opts.top_k_accept)
    return lambda draft, logits, params, generator: accept_lossy(draft, LazyRows(logits, params), criterion, generator,
                                                                 params.greedy)


@dataclass
class RowState:
    """What one mesh carries between steps."""

    h: torch.Tensor  # [dim]: h_{s*-1}
    past: torch.Tensor | None  # history heads' window
    head_kv: tuple[torch.Tensor, torch.Tensor] | None  # the heads' K/V of this row's point cloud [D, H, M, hd] x 2
    memory: VertexMemory | None  # vertex_lookup
    generator: torch.Generator | None  # candidate stream
    ahead: list[list[float]] | None = None  # per node the last verdict could end at: its next candidates' columns
    ready: Proposal | None = None  # the next step's candidates, already read (ahead's row at the accepted node)


@dataclass
class Stage:
    """The heads' static inputs for a call on one position (a captured one reads them at fixed addresses): hidden state
    h [1, dim], token [1] (token_input heads), and the condition K/V of the row `staged`, written only when another
    row's call comes (at batch 1: once a mesh, not a step)."""

    h: torch.Tensor
    token: torch.Tensor | None
    kv: tuple[torch.Tensor, torch.Tensor] | None
    staged: RowState | None = None

    @classmethod
    def like(cls, h: torch.Tensor, kv, token_input: bool) -> "Stage":
        """For a hidden state like h [dim] and condition K/V like kv."""
        return cls(h.new_zeros(1, h.shape[-1]), h.new_zeros(1, dtype=torch.long) if token_input else None,
                   None if kv is None else tuple(torch.empty_like(t) for t in kv))

    def row(self, r: RowState) -> None:
        """Row r's condition K/V in the stage (a device copy where another row's are there)."""
        if self.staged is not r and self.kv is not None:
            for buf, t in zip(self.kv, r.head_kv):
                buf.copy_(t)
        self.staged = r


@dataclass(frozen=True, eq=False)
class ReadAhead:
    """The verify forward's post-step where the heads run ahead (`reads_ahead`; `MeshTarget.along`), inside its
    captured replay or after its eager forward: each position's greedy pick and, on its hidden state (and pick: token
    input heads), the first d heads' `greedy_columns`, as logits, hidden, block [R, S, 1 + k] float32 (picks first:
    one host copy reads both); every row in each product of the heads at once, row i attending to slot i's condition
    K/V (`store`). Hashed by identity: it keys the backbone's captures, so a later pool with the same statics reuses it
    (`held_statics`)."""

    stacked: StackedHeads
    lm_head: torch.nn.Module
    embed: torch.nn.Module
    dtype: torch.dtype
    d: int
    width: int
    temperature: float
    path_probs: bool
    # [C, D, H, M, hd] x 2: each slot's condition K/V (CA heads), C the row bucket of the pool's slots (a captured
    # forward's rows; those past the live ones pad)
    kv: tuple[torch.Tensor, torch.Tensor] | None

    def store(self, slot: int, kv: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Slot `slot`'s condition K/V [D, H, M, hd] x 2 (a device copy, once a mesh)."""
        if self.kv is not None:
            for buf, t in zip(self.kv, kv):
                buf[slot].copy_(t)

    def move(self, src: int, dst: int) -> None:
        """Slot src's condition continues in slot dst (the loop compacts its live rows)."""
        if self.kv is not None:
            for buf in self.kv:
                buf[dst].copy_(buf[src])

    def __call__(self, logits: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picks = logits.argmax(-1)  # [R, S]: device ops only, R and S the forward's (a bucket's) shape
        r, s = picks.shape
        k, v = (None, None) if self.kv is None else (t[:r] for t in self.kv)  # [R, D, H, M, hd] each
        heads = head_logits(self.stacked, self.lm_head, self.embed, self.dtype, self.d, hidden.reshape(r * s, -1),
                            picks.view(-1) if self.stacked.token_input else None, k, v)[0]  # [d R S, V], head-major
        cols = greedy_columns(heads.view(self.d, r, s, -1).permute(1, 2, 0, 3), self.temperature, self.path_probs,
                              self.width)  # [R, S, k]: all rows' heads in one call of each product
        return logits, hidden, torch.cat([picks[..., None].float(), cols], -1)


class XSpecMeshPool(PoolBase):
    """Head candidates for every live mesh; `decoder`: the MeshDecoder whose heads, LM head, `_candidates` it uses."""

    def __init__(self, decoder, target, opts, params: SamplingParams, d_max: int,
                 draft_generators: Sequence[torch.Generator | None], slots: int = 1) -> None:
        self.decoder, self.target, self.opts, self.params, self.d = decoder, target, opts, params, d_max
        self.draft_generators = draft_generators
        self.held = held_statics(decoder, opts, params)
        self.stacked = self.held["stacked"] = self.held.get("stacked") or decoder.heads.stacked()  # D heads, one op
        self.widths = opts.tree_widths  # a candidate tree's widths, one a head; () for the chain
        if len(self.widths) > d_max or (self.widths and self.stacked.history):
            raise UsageError(f"candidate_tree {opts.candidate_tree}: one width a head, at most the {d_max} heads run, "
                             "and heads without a history window")
        self.width = max(self.widths, default=1)  # the candidates a head gives
        self.nodes = tree_nodes(self.widths) if self.widths else d_max  # the most nodes a draft holds
        self.ahead = reads_ahead(target.device, params, opts, self.stacked)
        # the heads' post-step of the verify forward for `slots` rows where they run ahead (`MeshTarget.along`)
        self.along = self.read_ahead(slots) if self.ahead else None
        self.calls: list[int] = []  # the positions of each heads call since the last `propose` (`drafted`)
        self.stage: Stage | None = None  # at the first admission (the conditions' shape): a held one of that shape
        self.stage_key: tuple = ()  # its shapes: part of the heads' capture keys (a capture reads one stage)
        if opts.vertex_lookup and decoder.model.vocab_size != BPTTokenizer.vocab_size:  # the memory reads BPT's 8 x 16
            raise UsageError(f"vertex_lookup needs a BPT backbone ({BPTTokenizer.vocab_size} tokens), "
                             f"this one has {decoder.model.vocab_size}")

    def admit(self, slot: int, index: int, prompt: list[int], first: TargetOut) -> None:
        h = first.features[0, -1]  # [dim]: the start's hidden state
        context = self.stacked.context_kv(self.decoder.heads.context_kv(self.target.conditions[index]))
        if self.stage is None:
            self.stage_key = ("stage", tuple(h.shape), None if context is None else tuple(t.shape for t in context))
            self.stage = self.held.get(self.stage_key) or Stage.like(h, context, self.stacked.token_input)
            self.held[self.stage_key] = self.stage
        if self.along is not None:
            self.along.store(slot, context)
        self.rows[slot] = RowState(h, window(self.stacked, h[None], None), context,
                                   VertexMemory() if self.opts.vertex_lookup else None, self.draft_generators[index])

    def read_ahead(self, slots: int) -> ReadAhead:
        """The held `ReadAhead` of these statics for `slots` rows (made once: a later pool's forwards replay the
        captures that read it); its condition buffers [C, D, H, M, hd] x 2 of CA heads (M: the point encoder's
        latents)."""
        dtype, model, st = DRAFT_DTYPES[self.opts.draft_dtype], self.decoder.model, self.stacked
        key = ("ahead", slots, self.d, self.width)
        if key not in self.held:
            kv = None
            if st.kind == "ca":
                rows = next((r for r in ROW_BUCKETS if r >= slots), slots)  # a captured verify's rows: at most these
                shape = (rows, st.res_b.shape[1], st.n_heads, model.enc_cfg.num_latents, st.wq.shape[-1] // st.n_heads)
                kv = (st.res_b.new_zeros(shape), st.res_b.new_zeros(shape))
            self.held[key] = ReadAhead(st, self.decoder._lm_head(dtype), model.decoder.tok_embeddings, dtype, self.d,
                                       self.width, self.params.temperature, bool(self.opts.min_path_prob), kv)
        return self.held[key]

    def move(self, src: int, dst: int) -> None:
        super().move(src, dst)
        if self.along is not None:
            self.along.move(src, dst)

    def propose(self, seqs: Sequence[list[int]], budgets: Sequence[int], stats: Sequence[DecodeStats]) -> list[Draft]:
        """1. x_{s*+1 ..} after each row's root x_{s*} = seq[-1] (seq = [cloud index] + the mesh so far)."""
        self.calls = []
        drafts = []
        for r, seq, budget in zip(self.rows, seqs, budgets):
            if budget <= 0:  # the loop's budget runs this step as AR: the heads are not run at all
                drafts.append(Draft.empty())
                continue
            mesh, x = seq[1:-1], seq[-1]
            # read ahead, the candidates are known (no memo to build each step); else the heads run once, and only if a
            # position needs them
            heads = (lambda p=r.ready: p) if r.ready is not None else functools.cache(
                functools.partial(self.heads, r, x))
            if self.widths:  # a candidate tree, its depth within the budget
                drafts.append(self.decoder._tree(mesh, x, heads, self.widths[:budget], r.memory))
                continue
            proposal = self.decoder._candidates(mesh, x, heads, self.d, self.opts, r.memory)
            chain = proposal.cut(self.opts.min_path_prob)
            eos = self.decoder.eos_id
            if eos in chain:  # nothing after an EOS candidate
                chain = chain[: chain.index(eos) + 1]
            drafts.append(Draft.chain(chain[: max(0, budget)]))
        return drafts

    def heads(self, r: RowState, token: int) -> Proposal:
        """D candidates from the heads on h_{s*-1} = r.h [1, dim], the projected window r.past (history heads) and
        x_{s*} = token (token_input heads); greedy ones read as `greedy_columns`, computed with the heads."""
        stage = self.stage
        stage.row(r)
        stage.h.copy_(r.h)
        if stage.token is not None:
            copy_into(stage.token, torch.tensor([token]))
        inputs = {} if r.past is None else {"past": r.past}
        if greedy_draft(self.params, self.opts):
            return Proposal.of_columns(self.run_heads(True, inputs).tolist()[0], self.d, self.width)
        return head_candidates(self.run_heads(False, inputs), self.params, self.opts, r.generator)

    def run_heads(self, columns: bool, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The first d heads on the staged row's position (`Stage`) and `inputs` (the window `past` of history heads):
        their logits [d, V], or (columns) their `greedy_columns` [1, d or 2 d]: device ops only. Captured heads return
        their graph's buffers: read them before the next call."""
        dtype, model, stage, d = DRAFT_DTYPES[self.opts.draft_dtype], self.decoder.model, self.stage, self.d
        path_probs = bool(self.opts.min_path_prob)

        def step(past: torch.Tensor | None = None) -> tuple[torch.Tensor]:
            k, v = stage.kv if stage.kv is not None else (None, None)
            logits = head_logits(self.stacked, self.decoder._lm_head(dtype), model.decoder.tok_embeddings, dtype, d,
                                 stage.h, stage.token, k, v, past)[0]
            if not columns:
                return (logits,)
            return (greedy_columns(logits[None], self.params.temperature, path_probs, self.width),)

        self.calls.append(1)
        graphs = self.decoder.heads.graphs
        key = ("heads", self.stage_key, d, columns, self.width, dtype,
               *((name, tuple(t.shape)) for name, t in inputs.items()))
        return (step(**inputs) if graphs is None else graphs.call(key, step, inputs))[0]

    def drafted(self) -> list[int]:
        return self.calls  # each call: the d heads on its positions (`xspecmesh.HeadsForward` times one)

    def take(self, host: list[list[list[float]]]) -> None:
        """`ReadAlong`: the host copy of the verify's `ReadAhead` columns, kept per row until its verdict says where the
        accepted path ends (parsed then, for that node alone: all of a 64-node tree's were the largest Python item of
        an H200's step)."""
        for r, row in zip(self.rows, host):
            r.ahead = row
            self.calls.append(len(row))

    def on_accept(self, drafts: Sequence[Draft], verdicts: Sequence[Verdict], out: TargetOut,
                  sizes: Sequence[int], branches: int) -> None:
        """5. h_{s*-1} and the history window after committing x_s .. x_{s*-1}; the next candidates if read ahead.
        The accepted path ends at fed node `last` (a chain's: its length; a tree's: its last node's index)."""
        for i, (r, verdict) in enumerate(zip(self.rows, verdicts)):
            last = verdict.kept()[-1]
            if self.stacked.history:  # a chain (no candidate tree with history heads): its first last + 1 nodes
                r.past = window(self.stacked, out.features[i, : last + 1], r.past)
            r.ready = None if r.ahead is None else Proposal.of_columns(r.ahead[last], self.d, self.width)
            r.ahead = None
            if r.ready is None:  # read ahead, the next candidates are known: no heads call needs h
                r.h = out.features[i, last]


def held_statics(decoder, opts, params: SamplingParams) -> dict:
    """What the heads' captured calls read besides their staged inputs (the stacked weights, the stage, the LM head
    they draft with), held by the heads' graphs so that a later pool (the next `generate_batch`) replays the captures
    instead of capturing again. A pool with other weights (their in-place versions), dtype, temperature or path rule
    (constants frozen into a capture) drops them first, and the backbone's captures that ran their `ReadAhead`.
    Without captures: a dict of this pool's own."""
    graphs = decoder.heads.graphs
    if graphs is None:
        return {}
    dtype = DRAFT_DTYPES[opts.draft_dtype]
    weights = [*decoder.heads.parameters(), *decoder.model.decoder.output.parameters(),
               *decoder.model.decoder.tok_embeddings.parameters()]
    # an inference tensor (weights loaded under inference_mode) keeps no version counter: its address alone
    versions = tuple((p.data_ptr(), -1 if p.is_inference() else p._version) for p in weights)
    key = (versions, dtype, params.temperature, bool(opts.min_path_prob))
    if graphs.held.get("key") != key:
        if decoder.model.decoder.graphs is not None:  # the backbone's captures that ran the old heads ahead go too
            decoder.model.decoder.graphs.forget([v for v in graphs.held.values() if isinstance(v, ReadAhead)])
        graphs.reset()
        graphs.held.update(key=key, lm_head=decoder._lm_head(dtype))  # kept alive while a capture reads it
    return graphs.held


def tree_nodes(widths: tuple[int, ...]) -> int:
    """The most nodes a candidate tree of these widths holds: w_1 + w_1 w_2 + .. (a known offset is one child)."""
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


def window(stacked, rows: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor | None:
    """History heads: window K/V rows [D, W', 2 inner] after committing hidden rows [n, dim] (in position order); the
    newest first, at most `history`. Each hidden state is projected once. None for other heads."""
    if stacked is None or not stacked.history:
        return None
    new = stacked.project_history(rows.flip(0))  # [D, n, 2 inner], newest first
    return (new if past is None else torch.cat([new, past], 1))[:, : stacked.history]
