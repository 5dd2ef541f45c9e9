"""Decode steps (cached forwards, EAGLE tree growths, XSpecMesh heads) captured as CUDA graphs (docs/precision.md)."""

from __future__ import annotations

import re
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable

import torch
import torch.nn.functional as F

from specgen.decoding.cache import KVCache
from specgen.decoding.verify import HostBatch
from specgen.devices import copy_into
from specgen.errors import UsageError
from specgen.models import kernel_choice
from specgen.models.attention import NativePlan, chain_plan, native_plan
from specgen.models.eagle import EagleNet
from specgen.models.heads import XSpecMeshHeads, head_logits
from specgen.models.kernel_choice import attention_path, native_norms
from specgen.models.rope import Rotation, rows_rotation
from specgen.models.sliced_linear import SLICE_ROWS, SlicedLinear
from specgen.models.transformer import Transformer, additive_mask

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_WIDTH = 256  # the narrowest cache width a step reads (a power of two); each wider bucket doubles it
MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Bucket:
    """A captured shape: `rows` cache rows (CFG branches counted) by `nodes` new nodes each, reading the cache's
    first `width` slots (a step's attention work grows with the slots it reads, not with the buffer's size)."""

    rows: int
    nodes: int
    width: int


@dataclass
class StaticInputs:
    """One step's inputs on the device: a bucket's buffers (`for_bucket`, a call copies its real part in and pads the
    rest) or a drafter level's tensors inside a captured tree growth (`lists` given instead of `tree`)."""

    tokens: torch.Tensor  # [R, S]
    positions: torch.Tensor  # [R, S]
    meta: torch.Tensor  # [2, R]: lengths, cache row written
    tree: torch.Tensor | None = None  # [R, S, S]
    # a drafter level's visible cache slots as the list attention reads them (eagle_grow.LevelLists): idx [R, S, T]
    # int32 (ascending; entries past a query's count repeat a visible slot), count [R, S] int32, shared [R] int32
    lists: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    features: torch.Tensor | None = None  # [R, S, D] (EAGLE's inputs)
    joined: torch.Tensor | None = None  # [R, S, 2 D]: EAGLE's input already joined (a growth level's, by its beam)
    rotation: Rotation | None = None  # a drafter level's (made for all its levels at once); else the positions'
    eye: torch.Tensor | None = None  # [R, S, S]: a padding node sees itself
    chain: torch.Tensor | None = None  # [S, S]: a chain's tree mask
    views: dict = field(default_factory=dict)  # (n, s, branches) -> the buffers' views over a call's real part (`real`)
    # the last call's rows, nodes and whether its tree was the chain: outside its rows and nodes `tree` holds the `eye`
    dirty: tuple[int, int, bool] = (0, 0, False)
    ints: torch.Tensor | None = None  # [2 R S + 3 R]: tokens, positions, meta, `last`: one buffer (views), one copy
    last: torch.Tensor | None = None  # [R]: each row's last real node (a catch-up's roots: `StepGraphs.forward_host`)

    def real(self, n: int, s: int, branches: int = 1) -> tuple:
        """(tokens, positions, features, tree) over a call's real n sequences x s nodes, each [branches, n, s, ...]
        (a sequence's branch rows are consecutive: a copy of per-sequence inputs broadcasts over the branches), and
        the chain mask [s, s]: views made once per shape (a view is a host op, and a step stages several)."""
        if (n, s, branches) not in self.views:
            rows = n * branches
            per_branch = lambda t: t[:rows, :s].unflatten(0, (n, branches)).transpose(0, 1)  # noqa: E731
            self.views[n, s, branches] = (
                per_branch(self.tokens), per_branch(self.positions),
                None if self.features is None else per_branch(self.features),
                per_branch(self.tree)[..., :s], self.chain[:s, :s])
        return self.views[n, s, branches]

    @classmethod
    def for_bucket(cls, b: Bucket, device, features: tuple | None = None) -> "StaticInputs":
        r, s = b.rows, b.nodes
        ints = torch.zeros(2 * r * s + 3 * r, dtype=torch.long, device=device)
        eye = torch.eye(s, dtype=torch.bool, device=device)
        return cls(ints[: r * s].view(r, s), ints[r * s : 2 * r * s].view(r, s), ints[2 * r * s : -r].view(2, r),
                   eye.repeat(r, 1, 1), eye=eye.expand(r, -1, -1), chain=torch.ones_like(eye).tril(), ints=ints,
                   last=ints[-r:],
                   features=None if features is None else torch.zeros(r, s, features[0], dtype=features[1],
                                                                      device=device))


class StaticCache:
    """The cache as a captured forward sees it: writes go to device-computed slots, reads see all T slots."""

    def __init__(self, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, width: int) -> None:
        """Each node's key and value go to row meta[1, b], slot meta[0, b] + j (its row's length + j)."""
        self.k, self.v, self.meta, self.width = k, v, x.meta, width  # k, v [L, C + 1, Hkv, T, D]
        self.rows, self.nodes = x.tokens.shape

    @cached_property
    def where(self) -> tuple[torch.Tensor, ...]:
        """The write index per [R, Hkv, S] entry: rows [R, 1, 1], heads [Hkv, 1], slots [R, 1, S] (the torch path's
        scatter; `rope_store` reads meta itself)."""
        dev = self.k.device
        return (self.meta[1][:, None, None], torch.arange(self.k.shape[2], device=dev)[:, None],
                (self.meta[0][:, None] + torch.arange(self.nodes, device=dev))[:, None])

    def store(self, layer: int, qkv: torch.Tensor, rot, heads: int) -> tuple[torch.Tensor, ...]:
        """KVCache.store's q [R, Hq, S, D] and the layer's rows [0, R) over the first W slots [R, Hkv, W, D] each. On
        CUDA one Triton pass rotates q and k (rope's bits) and writes k and v at the index's slots (`rope_store`)."""
        k, v = self.k[layer], self.v[layer]
        if kernel_choice.one_pass(qkv):
            q = torch.ops.specgen.rope_store(qkv, rot.cos, rot.sin, k, v, self.meta, heads, rot.layout == "half")
        else:
            q, k_new, v_new = rot.split(qkv, heads)
            k.index_put_(self.where, k_new)  # any strides: one scatter each, no copy first
            v.index_put_(self.where, v_new)
        return q, k[: self.rows, :, : self.width], v[: self.rows, :, : self.width]


def meta_rows(lengths: list[int], rows: int, bucket_rows: int, scratch: int) -> list[list[int]]:
    """A bucket's meta [2, R] on the host: each row's length and the cache row it writes (a padding row: length 0,
    the scratch row)."""
    return [list(lengths) + [0] * (bucket_rows - rows), list(range(rows)) + [scratch] * (bucket_rows - rows)]


def visibility(x: StaticInputs, t: int) -> torch.Tensor:
    """[R, 1, S, T] bool: each node sees its row's committed slots and the pending slots its tree mask names; or a
    drafter level's `lists` as a mask. A node always sees its own slot, so that a padding node's key and value stay
    finite: every tree mask holds its diagonal (a padding node's row is the bucket's `eye`), every list its own slot."""
    r, s = x.tokens.shape
    if x.lists is not None:
        idx = x.lists[0].long()
        return torch.zeros(r, s, t, dtype=torch.bool, device=idx.device).scatter_(2, idx, True).unsqueeze(1)
    rel = torch.arange(t, device=x.tokens.device)[None, :] - x.meta[0][:, None]  # [R, T]: slot - the row's length
    col = rel.clamp(0, s - 1)  # [R, T]: the tree column of each pending slot (equal to rel there only)
    pending = x.tree.gather(2, col[:, None, :].expand(r, s, t))  # [R, S, T]
    return ((pending & (col == rel)[:, None, :]) | (rel < 0)[:, None, :]).unsqueeze(1)


def step_mask(visible: torch.Tensor, cfg, dtype: torch.dtype):
    """What a step's blocks attend with, by `attention_path` as an eager forward's: the list plan (each query's visible
    slots in AR's order: exact for trees too), else SDPA's float32 additive mask or the chunked chain plan (a target's
    trees stay eager there: `StepGraphs.servable`)."""
    r, _, s, t = visible.shape
    path = attention_path(dtype, visible.device)
    if path == "native":
        return native_plan(visible, r, s, t, cfg.n_heads, cfg.hd, dtype=dtype, device=visible.device)
    if path == "sdpa":
        return additive_mask(visible)
    return chain_plan(visible, r, s, t, cfg.n_heads, cfg.n_kv_heads, cfg.hd, visible.device)


def listed(x: StaticInputs, cfg, dtype: torch.dtype) -> NativePlan | None:
    """A drafter level's lists as the list attention's plan (what `native_plan` would make of their mask: the plan is
    the lists), where the step attends over lists (`attention_path`); else None."""
    if x.lists is None or attention_path(dtype, x.tokens.device) != "native":
        return None
    r, s = x.tokens.shape
    return NativePlan(*x.lists, torch.empty(r, s, cfg.n_heads, cfg.hd, dtype=dtype, device=x.tokens.device))


def step_attention(x: StaticInputs, cfg, h: torch.Tensor, t: int):
    """What a step's blocks attend with over T = `t` slots: a drafter level's lists (`listed`); on CUDA with the
    Triton kernels the list plan of its `visibility` in one pass, no mask made (`step_plan`: the same lists);
    else the mask's (`step_mask`)."""
    if (lists := listed(x, cfg, h.dtype)) is not None:
        return lists
    if kernel_choice.one_pass(h) and attention_path(h.dtype, h.device) == "native":
        r, s = x.tokens.shape
        idx, count, shared = torch.ops.specgen.step_plan(x.meta[0], x.tree, t)
        return NativePlan(idx, count, shared, torch.empty(r, s, cfg.n_heads, cfg.hd, dtype=h.dtype, device=h.device))
    return step_mask(visibility(x, t), cfg, h.dtype)


def blocks(module, h: torch.Tensor, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross,
           width: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A Transformer's or EAGLE drafter's blocks on one bucket over its input embeddings h [R, S, dim], reading the
    cache's first `width` slots (None: all; slots past a row's own add exact zeros, so any width that holds them
    gives the same bits): their output as (x, f), x + f unsummed (f None: x is it), [R, S, dim] each."""
    width = width or k.shape[3]
    rot = x.rotation or rows_rotation(module.rope_table[x.positions].to(h.dtype), module.cfg.rope_layout)
    mask = step_attention(x, module.cfg, h, width)
    cache, r = StaticCache(x, k, v, width), x.tokens.shape[0]
    # each layer's condition K/V: the bucket's first R rows of the static buffer
    conds = [None] * len(module.layers) if cross is None else [(ck[:r], cv[:r]) for ck, cv in cross]
    if native_norms(h, module.layers[0].ffn_norm.weight):  # each residual add in the next norm
        f = None
        for i, (blk, cond) in enumerate(zip(module.layers, conds)):
            h, f = blk.deferred(h, f, rot, i, cache, mask, False, cond)
        return h, f
    for i, (blk, cond) in enumerate(zip(module.layers, conds)):
        h = blk(h, rot, i, cache, mask, False, cond)
    return h, None


def target_step(model, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross,
                width: int | None = None) -> tuple[torch.Tensor, ...]:
    """A Transformer's cached forward on one bucket: logits [R, S, V] and hidden [R, S, dim]; device ops only."""
    h, f = blocks(model, model.tok_embeddings(x.tokens), x, k, v, cross, width)
    n = model.norm
    hidden = n(h) if f is None else torch.ops.specgen.add_rms_norm(h, f, n.weight, n.eps)[1]
    return model.output(hidden), hidden


def drafter_input(embedding: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """An EAGLE drafter's input [R, S, 2 D]: the tokens' [R, S] embeddings (`embedding` [V, D]) and the features
    [R, S, D] side by side; on CUDA one launch (`embed_cat`: a copy, the same bits)."""
    if kernel_choice.one_pass(features):
        return torch.ops.specgen.embed_cat(embedding, tokens, features)
    return torch.cat([F.embedding(tokens, embedding), features], dim=-1)


def eagle_step(net, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross,
               width: int | None = None) -> tuple[torch.Tensor, ...]:
    """An EAGLE drafter's cached forward on one bucket: predicted features [R, S, D]; device ops only."""
    pair = drafter_input(net.tok_embeddings.weight, x.tokens, x.features) if x.joined is None else x.joined
    h, f = blocks(net, net.fc(pair), x, k, v, cross, width)
    return (h if f is None else h + f,)


@dataclass(frozen=True)
class StepKind:
    """How a module's steps are captured: its step function, and whether its low-precision trees stay eager (a target's;
    a drafter's only decide what is proposed)."""

    step: Callable
    exact_trees: bool = True
    # a caller may keep a step's outputs past the module's next call (a target's features and logits: a row's drafter
    # keeps views of them, decoding/recorder.py too), so `forward` hands out copies; a drafter's catch-up reads its
    # output before the drafter's next call (methods/eagle.py), so its outputs are the graph's own buffers
    kept: bool = True


class StepGraphs:
    """A module's static cache and its captured steps, one CUDA graph per bucket (`capture=False`: the same static
    step run eagerly, which is what the CPU tests exercise). Invariants (tests/models/test_graphs.py): no host reads
    inside a step; shapes depend only on the bucket; a query's sums do not depend on the cache width T (so a step
    reads only its bucket's `width`)."""

    def __init__(self, model, kind: StepKind, capture: bool = True, strict: bool = False) -> None:
        self.model, self.kind, self.capture = model, kind, capture
        self.strict = strict  # `--graphs on`: a step that cannot be captured is an error, not an uncaptured fallback
        # products in SLICE_ROWS-row GEMMs (SlicedLinear): a bucket holds whole slices, so no product copies its rows
        self.fill = SLICE_ROWS if any(isinstance(m, SlicedLinear) for m in model.modules()) else 1
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.graphs: dict[Bucket | tuple, tuple] = {}  # bucket or a call's key -> (inputs, graph or None, outputs)
        self.uses: Counter = Counter()  # key -> calls served (replays; eager reruns where capture is off)
        self.eager_calls = 0
        self.recorded = 0  # keys' first calls (captures), resets included: what a run paid in captures
        self.prompts: StepGraphs | None = None  # the prompts' own one-row buffer and captures (`prefill`)
        self.reset()

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[1] - 1

    def __deepcopy__(self, memo: dict) -> None:
        """A copied module runs eagerly: these captures read the original's parameters and buffers."""
        return None

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache over the static buffer's first `batch` rows (lengths rounded up, so similar calls keep the captures);
        every cache handed out shares the one buffer: a module decodes one batch at a time. The buffer only grows
        (its rows and width the most asked for so far): each growth drops the captures."""
        need = -(-(max_len + NODE_BUCKETS[-1]) // 512) * 512
        if self.k is None or batch > self.capacity or need > self.k.shape[3]:
            rows, need = max(batch, self.capacity), max(need, 0 if self.k is None else self.k.shape[3])
            self.reset()
            cfg = self.model.cfg
            base = KVCache.allocate(cfg.n_layers, rows + 1, cfg.n_kv_heads, need, cfg.hd, self.dtype, self.device)
            self.k, self.v = base.k, base.v
        cache = KVCache(self.k[:, :batch], self.v[:, :batch], [0] * batch)
        if self.cross is not None:
            cache.cross = [(k[:batch], v[:batch]) for k, v in self.cross]
        return cache

    def reset(self) -> None:
        """Drop the captures and the static buffers (a larger cache was asked for, or the weights a capture reads)."""
        self.graphs.clear()  # their pool goes with them: the next capture opens a new one
        self.recorded += self.prompts.captures if self.prompts is not None else 0  # what they cost stays counted
        self.prompts = None
        self.k = self.v = None  # [L, C + 1, Hkv, T, D]: C cache rows and one scratch row for padding rows
        self.cross = None  # per layer (k, v) [C, H, M, D]: the conditions (cross-attention models)
        self.roots = None  # [C, 1, D]: each row's catch-up root, a growth's input read in place (`forward_host`)
        self.pool, self.graph_bytes = None, 0  # the captures' memory pool, and the device memory it holds

    def bucket(self, n: int, s: int, filled: int) -> Bucket | None:
        """The bucket of n rows by s nodes over rows holding up to `filled` slots; None: none holds it (eager)."""
        rows = min(next((r for r in ROW_BUCKETS if r >= n), n), self.capacity)
        nodes = next((m for m in NODE_BUCKETS if m >= s), None)
        if nodes is not None and self.fill % rows == 0:  # padding nodes up to a whole slice: a padding node costs
            nodes = max(nodes, self.fill // rows)  # one query over its own slot, a product's row copy one launch
        if n > ROW_BUCKETS[-1] or nodes is None or filled + nodes > self.k.shape[3]:
            return None
        return Bucket(rows, nodes, self.width(filled + nodes))

    def width(self, slots: int) -> int:
        """The narrowest width bucket (MIN_WIDTH, doubling, at most the static buffer's) that holds `slots` slots."""
        return min(max(MIN_WIDTH, 1 << (slots - 1).bit_length()), self.k.shape[3])

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, tree_mask: torch.Tensor | None,
                branches: int = 1, post: Callable | None = None) -> tuple[torch.Tensor, ...] | None:
        """The step's outputs for the real part by a replay, or None where this call must run eagerly. tokens,
        positions [n, S] (and a [n, S, S] tree mask) are per sequence, each sequence run on its `branches`
        consecutive cache rows; `post` (hashable: it keys the captures) maps the step's outputs inside the replay
        (CFG's combine: image/target.py). An output's real rows are the n * branches rows, or n where `post` made
        one a sequence."""
        n, s = tokens.shape

        def stage(x: StaticInputs, b: Bucket) -> None:
            real_tokens, real_positions = x.real(n, s, branches)[:2]
            real_tokens.copy_(tokens)
            real_positions.copy_(positions)
            rows = n * branches
            host = torch.tensor(meta_rows(cache.lengths, rows, b.rows, self.capacity))
            copy_into(x.meta, host)

        return self.replay(n, s, cache, tree_mask, None, branches, post, stage)

    def forward_host(self, batch: HostBatch, cache: KVCache, features: torch.Tensor) -> torch.Tensor | None:
        """An EAGLE drafter's forward over inputs built on the host (its catch-up: `host_batch`): its tokens, positions,
        the bucket's meta and each row's last real node (`sizes` - 1) staged in one copy from page-locked memory; the
        features [n, S, D] (any dtype: the copy casts them). Its result, each row's predicted features at its last
        node [n, 1, D] (the roots of its tree growth), gathered inside the replay into `roots` (`root_rows`: a growth
        reads them there, no copy between the graphs; read them before the drafter's next catch-up), or None where
        this call must run eagerly."""
        n, s = len(batch.tokens), len(batch.tokens[0])

        def stage(x: StaticInputs, b: Bucket) -> None:
            pad, pad_rows = [0] * (b.nodes - s), [0] * (b.nodes * (b.rows - n))  # padding: token 0 at position 0
            block = lambda rows: [v for row in rows for v in row + pad] + pad_rows  # noqa: E731  [R, S] flat
            meta = meta_rows(cache.lengths, n, b.rows, self.capacity)
            last = [m - 1 for m in batch.sizes] + [0] * (b.rows - n)  # a padding row: its node 0's (finite)
            host = torch.tensor(block(batch.tokens) + block(batch.positions) + meta[0] + meta[1] + last)
            copy_into(x.ints, host)
            x.real(n, s)[2].copy_(features)

        roots = self.root_buffer(features.shape[-1])
        outs = self.replay(n, s, cache, batch.tree_mask(), features.shape[-1], 1, None, stage, roots)
        return None if outs is None else roots[:n]

    def root_buffer(self, dim: int) -> torch.Tensor:
        """`roots` [C, 1, dim], made on first use (outside any capture: every growth graph reads the one buffer)."""
        if self.roots is None:
            self.roots = torch.zeros(self.capacity, 1, dim, dtype=self.dtype, device=self.device)
        return self.roots

    def root_rows(self, hidden: torch.Tensor, rows: int) -> torch.Tensor:
        """The first `rows` rows of `roots` holding the roots hidden [n, 1, D] in their first n: a captured catch-up
        gathered them there (`forward_host`: nothing to copy), an eager one's are copied in. Rows past n (a growth's
        padding sequences) keep what the buffer held, finite: zeros or a catch-up's padding rows."""
        roots = self.root_buffer(hidden.shape[-1])
        if hidden.data_ptr() != roots.data_ptr():
            roots[: hidden.shape[0]].copy_(hidden)
        elif hidden.shape[0] == rows:  # the catch-up's own view (no padding sequence): no second view (a host op)
            return hidden
        return roots[:rows]

    def replay(self, n: int, s: int, cache: KVCache, tree_mask: torch.Tensor | None, feature_dim: int | None,
               branches: int, post: Callable | None, stage: Callable[[StaticInputs, Bucket], None],
               roots: torch.Tensor | None = None):
        """`forward`'s and `forward_host`'s replay: the bucket's buffers, `stage`d by the caller (its tokens, positions,
        meta and features) and here (its tree), the step (and `post`) replayed, the real part of its outputs; given
        `roots` (a drafter's catch-ups: all of a module's forward_host steps), each row's features at its `last` node
        gathered into them inside the replay, and the outputs as the graph holds them (the caller reads `roots`)."""
        rows = n * branches
        b = self.bucket(rows, s, max(cache.lengths)) if self.servable(cache, tree_mask) else None
        if b is None:
            self.eager_calls += 1
            return None
        key = b if post is None else (b, post)
        x = self.graphs[key][0] if key in self.graphs else StaticInputs.for_bucket(
            b, self.device, None if feature_dim is None else (feature_dim, self.dtype))
        stage(x, b)
        self.stage_tree(x, n, s, branches, tree_mask)
        step = lambda: self.kind.step(self.model, x, self.k, self.v, self.cross, b.width)  # noqa: E731
        if roots is not None:
            step = partial(gather_roots, step, x, roots)
        outs = self.run(key, x, step if post is None else lambda: post(*step()),
                        f"bucket of {b.rows} rows x {b.nodes} nodes over {b.width} slots")
        if roots is not None:  # a catch-up: its result is `roots`, its outputs unread (no views of them to make)
            return outs
        real = [(o, rows if o.shape[0] == b.rows else n) for o in outs]
        outs = tuple(o if o.shape[:2] == (r, s) else o[:r, :s] for o, r in real)  # a slice is a host op: none unpadded
        return tuple(o.clone() for o in outs) if self.kind.kept else outs

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A prompt tokens [1, P] into the empty row `cache` holds (any row of the static buffer) as chunks of at most
        NODE_BUCKETS[-1] nodes, each a captured chain step over a one-row buffer of the prompts' own, whose keys and
        values are then copied into the row and committed: the last node's logits [1, 1, V] and every node's hidden
        states [1, P, dim]; None where a prompt attends otherwise than a step (`prompts_as_steps`: one eager forward
        then). The bits are one eager forward's: a query's sums do not depend on how many queries a forward holds."""
        if tokens.shape[0] != 1 or cache.lengths != [0] or not kernel_choice.prompts_as_steps(self.dtype, self.device):
            return None
        p, most = tokens.shape[1], NODE_BUCKETS[-1]
        if self.prompts is None:
            self.prompts = StepGraphs(self.model, self.kind, self.capture, self.strict)
        own = self.prompts.new_cache(1, p)
        outs = []
        for start in range(0, p, most):
            chunk = tokens[:, start : start + most]  # [1, s]
            positions = torch.arange(start, start + chunk.shape[1], device=tokens.device)[None]
            outs.append(self.prompts.forward(chunk, positions, own, None))  # (logits, hidden) [1, s, V | dim]
            if outs[-1] is None:
                return None
            own.commit_seqs({0: list(range(chunk.shape[1]))}, 1)
        cache.k[:, 0, :, :p].copy_(own.k[:, 0, :, :p])  # [L, Hkv, P, hd]
        cache.v[:, 0, :, :p].copy_(own.v[:, 0, :, :p])
        cache.commit_seqs({0: list(range(p))}, 1)
        return outs[-1][0][:, -1:], torch.cat([hidden for _, hidden in outs], 1)

    def call(self, key: tuple, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
             bound: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """`fn(**static)` over static copies of `inputs` on the module's device, whose shapes `key` fixes, and the
        `bound` inputs read in place (this module's own buffers, written before each call: `root_rows`): a replay of
        the key's graph (captured on its first call). An input on the host is copied in straight from page-locked
        memory, without waiting (`devices.copy_into`). The outputs are the graph's own buffers,
        in the pool all this module's graphs share (another graph's replay may write them): read them before this
        module's next call or forward."""
        static = self.graphs[key][0] if key in self.graphs else {
            n: torch.empty(t.shape, dtype=t.dtype, device=self.device) for n, t in inputs.items()} | (bound or {})
        for name, t in inputs.items():
            copy_into(static[name], t)
        return self.run(key, static, lambda: fn(**static), f"capture {key}")

    def run(self, key, static, step: Callable[[], tuple], what: str) -> tuple[torch.Tensor, ...]:
        """`step` over the key's staged static inputs: captured on its first call, then replayed (eager: rerun)."""
        _, graph, outs = self.graphs.get(key, (static, None, None))
        if outs is None:
            outs, graph = self.record(step, what)
            self.graphs[key] = (static, graph, outs)
            self.recorded += 1
        elif graph is not None:
            graph.replay()
        else:
            outs = step()
        self.uses[key] += 1
        return outs

    def servable(self, cache: KVCache, tree_mask: torch.Tensor | None) -> bool:
        """Whether a call runs on the static buffer: its cache is the buffer's first rows, no key mask (t2i captions
        stay eager), conditions in the static buffers, and no target tree on the chunked attention (StepKind)."""
        if self.k is None or cache.k.data_ptr() != self.k.data_ptr() or cache.key_mask is not None:
            return False
        if tree_mask is not None and self.kind.exact_trees and attention_path(self.dtype, self.device) == "chunked":
            return False  # the chunked chain plan puts a tree node's keys where the cache has them, not in AR's order
        if cache.cross is not None:
            self.adopt_cross(cache)
        return True

    def adopt_cross(self, cache: KVCache) -> None:
        """Keep the conditions in static buffers: copy them in when the loop's cache holds its own tensors."""
        if self.cross is not None and cache.cross[0][0].data_ptr() == self.cross[0][0].data_ptr():
            return
        shape = cache.cross[0][0].shape[1:]
        if self.cross is None or self.cross[0][0].shape[1:] != shape:
            self.graphs.clear()
            self.pool = None
            self.cross = [(k.new_zeros(self.capacity, *shape), v.new_zeros(self.capacity, *shape))
                          for k, v in cache.cross]
        rows = cache.cross[0][0].shape[0]
        for (k, v), (ck, cv) in zip(self.cross, cache.cross):
            k[:rows].copy_(ck)
            v[:rows].copy_(cv)
        cache.cross = [(k[:rows], v[:rows]) for k, v in self.cross]

    def stage_tree(self, x: StaticInputs, n: int, s: int, branches: int, tree_mask: torch.Tensor | None) -> None:
        """Copy a call's tree mask (per sequence: `forward`; None: a chain) into the bucket's. Padding nodes and rows
        keep what an earlier call left in the token, position and feature buffers (a valid token and position, a
        finite feature): no real node sees a padding node's slot (outside the real part the tree rows are the bucket's
        eye) and a padding row writes into the scratch row, so a real node's bits do not depend on them."""
        rows = n * branches
        real_tree, chain = x.real(n, s, branches)[3:]
        if x.dirty == (rows, s, True) and tree_mask is None:  # the last call's chain is in place (a catch-up's)
            return
        if rows < x.dirty[0] or s < x.dirty[1]:  # the last call's tree rows reach past this call's: eye again
            x.tree.copy_(x.eye)
        x.dirty = (rows, s, tree_mask is None)
        real_tree.copy_(chain if tree_mask is None else tree_mask)

    def record(self, step: Callable[[], tuple], what: str):
        """A key's first call: (outputs, its graph), or (outputs, None) where steps run uncaptured. Out of GPU memory
        is one line; any other capture failure is one line under `--graphs on` and, under auto, one warning, after
        which this module's steps run uncaptured (the same static steps: the same bits, without the replay's speed)."""
        if self.capture:
            try:
                return self.captured(step)
            except torch.cuda.OutOfMemoryError as e:
                raise out_of_memory(what, str(e), torch.cuda.mem_get_info()[0]) from None
            except RuntimeError as e:  # an op a graph cannot hold (a host read, a kernel or dtype without capture)
                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                if self.strict:
                    raise UsageError(f"--graphs on: the {what} cannot be captured ({why}); use --graphs auto or off"
                                     ) from None
                warnings.warn(f"--graphs auto: the {what} cannot be captured ({why}); "
                              f"{type(self.model).__name__} steps run uncaptured")
                self.capture = False
        return step(), None

    def captured(self, step: Callable[[], tuple]):
        """Run `step` once (warm-up: lazy initialisations stay outside the graph, and a host read raises there, before
        any capture begins), then capture it; (outputs, graph). A capture that fails anyway is undone (`abandon`)."""
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        stream, caller = torch.cuda.Stream(), torch.cuda.current_stream()
        stream.wait_stream(caller)
        with torch.cuda.stream(stream), syncs_raise():
            step()
        caller.wait_stream(stream)
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outs = step()
        except RuntimeError:
            abandon(self.pool, caller)
            raise
        pool = tuple(self.pool)  # what the captures keep reserved: the segments of their pool
        self.graph_bytes = sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
                               if tuple(seg.get("segment_pool_id", ())) == pool)
        graph.replay()
        return outs, graph

    @property
    def replays(self) -> int:
        return sum(self.uses.values())

    @property
    def captures(self) -> int:
        """Captures made so far, resets and the prompts' buffer included: what a run paid in captures."""
        return self.recorded + (self.prompts.captures if self.prompts is not None else 0)

    def describe(self) -> dict:
        """What the captures hold, for a benchmark's machine column."""
        own = {"graphs": len(self.graphs), "graph_mb": round(self.graph_bytes / 2**20, 1), "replays": self.replays,
               "eager_calls": self.eager_calls, "captures": self.recorded}
        child = self.prompts.describe() if self.prompts is not None else dict.fromkeys(own, 0)
        return {k: v + child[k] for k, v in own.items()}


def gather_roots(step: Callable[[], tuple], x: StaticInputs, roots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`step`'s outputs, its first, hidden [R, S, D], gathered at each row's `last` node into roots[:R] ([R, 1, D])."""
    outs = step()
    r, _, d = outs[0].shape
    torch.gather(outs[0], 1, x.last[:, None, None].expand(r, 1, d), out=roots[:r])
    return outs


@contextmanager
def syncs_raise():
    """CUDA's sync debug mode at "error" (a host read raises instead of waiting), the caller's mode restored after."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def abandon(pool, caller: torch.cuda.Stream) -> None:
    """What `torch.cuda.graph` leaves undone when its capture fails (its capture_end raises before either): the capture
    stream stays current, and the allocator still counts the capture as underway (every allocation then asks the dead
    graph's filter, frees used on other streams wait for good, and older torch (2.7) fails an internal assert at every
    later `torch.cuda.empty_cache()`, which each capture makes). The pool keeps its count: a later capture may share
    it."""
    try:
        torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), pool)
    except (RuntimeError, AttributeError):  # capture_end got that far, or the capture never began
        pass
    torch.cuda.set_stream(caller)


def out_of_memory(what: str, error: str, free: int) -> UsageError:
    """The one line for a bucket whose capture ran out of GPU memory: the bucket, what it asked for, what was free."""
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", error)
    need = f"asked for {asked.group(1)} more" if asked else "ran out of memory"
    return UsageError(f"--graphs: the {what} {need} with {free / 2**20:.0f} MiB of the GPU free; use --graphs off "
                      "or a smaller --batch-size")


KINDS = {Transformer: StepKind(target_step), EagleNet: StepKind(eagle_step, exact_trees=False, kept=False),
         XSpecMeshHeads: StepKind(head_logits)}  # module class -> how its steps are captured


def check_mode(mode, device: str) -> str:
    """`--graphs` in one line: a known mode, and `on` only where CUDA graphs exist; the mode (YAML reads a recipe's or
    an override's bare `on` / `off` as true / false)."""
    mode = {True: "on", False: "off"}[mode] if isinstance(mode, bool) else mode
    if mode not in MODES:
        raise UsageError(f"--graphs {mode!r}: use one of {', '.join(MODES)}")
    if mode == "on" and torch.device(device).type != "cuda":
        raise UsageError("--graphs on needs a CUDA device (CUDA graphs); on a CPU use --graphs auto or off")
    return mode


def attach(model, mode: str = "auto", capture: bool | None = None) -> StepGraphs | None:
    """Give `model` (a Transformer, an EAGLE drafter or XSpecMesh heads) captured steps per `mode` (auto: on CUDA;
    on: CUDA or a one-line refusal; off: none). A given `capture` is the caller's choice on any device: False runs the
    static steps uncaptured, True captures them (the CPU tests' replay emulation; a drafter following its target)."""
    device = next(model.parameters()).device
    on_cuda = device.type == "cuda"
    mode = check_mode(mode, "cuda" if capture is not None else str(device))
    model.graphs = None
    if mode == "off" or (mode == "auto" and not on_cuda and capture is None):
        return None
    model.graphs = StepGraphs(model, KINDS[type(model)], on_cuda if capture is None else capture, mode == "on")
    return model.graphs
