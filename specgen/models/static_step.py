"""What a captured step computes: a cached forward over a bucket's static inputs and cache, device ops only."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import torch
import torch.nn.functional as F

from specgen.models import kernel_choice
from specgen.models.attention import NativePlan, chain_plan, in_window, key_positions, native_plan
from specgen.models.kernel_choice import attention_path
from specgen.models.moe import static_routing
from specgen.models.rope import Rotation, rows_rotation
from specgen.models.transformer import additive_mask, deferrable, layer_rotations


MIN_WIDTH = 256  # the narrowest cache width a step reads (a power of two); each wider bucket doubles it (graphs.py)


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
    # [R, S, S]: every node of every row sees itself and the nodes before it: a chain's mask for any real part, and
    # the base a tree's is written over (a padding node sees itself; no real node sees a node after it)
    causal: torch.Tensor | None = None
    # [R, M]: which of each row's first M committed slots its queries see (a t2i caption's padding hidden: the
    # cache's `key_mask`, rows of the captured steps' static buffer); None: every committed slot
    key_mask: torch.Tensor | None = None
    views: dict = field(default_factory=dict)  # (n, s, branches) -> the buffers' views over a call's real part (`real`)
    # None: `tree` is the causal base; else the last tree's rows and nodes, the causal base outside them
    dirty: tuple[int, int] | None = None
    ints: torch.Tensor | None = None  # [2 R S + 3 R + E]: tokens, positions, meta, `last`, `extra`: one buffer
    last: torch.Tensor | None = None  # [R]: each row's last real node (a catch-up's roots: `StepGraphs.catch_up`)
    extra: torch.Tensor | None = None  # [E]: the host ints of what a catch-up's replay runs next (`roots_then`)

    def real(self, n: int, s: int, branches: int = 1) -> tuple:
        """(tokens, positions, features, tree) over a call's real n sequences x s nodes, each [branches, n, s, ...]
        (a sequence's branch rows are consecutive: a copy of per-sequence inputs broadcasts over the branches): views
        made once per shape (a view is a host op, and a step stages several)."""
        if (n, s, branches) not in self.views:
            rows = n * branches
            per_branch = lambda t: t[:rows, :s].unflatten(0, (n, branches)).transpose(0, 1)  # noqa: E731
            self.views[n, s, branches] = (
                per_branch(self.tokens), per_branch(self.positions),
                None if self.features is None else per_branch(self.features),
                per_branch(self.tree)[..., :s])
        return self.views[n, s, branches]

    @classmethod
    def for_bucket(cls, b: Bucket, device, features: tuple | None = None,
                   key_mask: torch.Tensor | None = None, extra: int = 0) -> "StaticInputs":
        r, s = b.rows, b.nodes
        ints = torch.zeros(2 * r * s + 3 * r + extra, dtype=torch.long, device=device)
        causal = torch.ones(s, s, dtype=torch.bool, device=device).tril().expand(r, -1, -1)
        end = 2 * r * s + 3 * r
        return cls(ints[: r * s].view(r, s), ints[r * s : 2 * r * s].view(r, s), ints[2 * r * s : end - r].view(2, r),
                   causal.clone(), causal=causal, ints=ints, last=ints[end - r : end], extra=ints[end:],
                   key_mask=key_mask,
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
    finite: every tree mask holds its diagonal (a padding node's row is the bucket's causal base), every list its own
    slot. A `key_mask` hides committed slots only (a padding row, length 0, has none: it still sees its own)."""
    r, s = x.tokens.shape
    if x.lists is not None:
        idx = x.lists[0].long()
        return torch.zeros(r, s, t, dtype=torch.bool, device=idx.device).scatter_(2, idx, True).unsqueeze(1)
    rel = torch.arange(t, device=x.tokens.device)[None, :] - x.meta[0][:, None]  # [R, T]: slot - the row's length
    col = rel.clamp(0, s - 1)  # [R, T]: the tree column of each pending slot (equal to rel there only)
    pending = x.tree.gather(2, col[:, None, :].expand(r, s, t))  # [R, S, T]
    committed = rel < 0  # [R, T]
    if x.key_mask is not None:
        m = min(x.key_mask.shape[1], t)
        committed[:, :m] &= x.key_mask[:, :m]
    return ((pending & (col == rel)[:, None, :]) | committed[:, None, :]).unsqueeze(1)


def step_mask(visible: torch.Tensor, cfg, dtype: torch.dtype):
    """What a step's blocks attend with, by `attention_path` as an eager forward's: the list plan (each query's visible
    slots in AR's order: exact for trees too), else SDPA's float32 additive mask or the chunked chain plan (a target's
    trees stay eager there: `StepGraphs.servable`)."""
    r, _, s, t = visible.shape
    path = attention_path(dtype, visible.device, cfg.attn_softcap)
    if path == "native":
        return native_plan(visible, r, s, t, cfg.n_heads, cfg.hd, dtype=dtype, device=visible.device,
                           softcap=cfg.attn_softcap)
    if path == "sdpa":
        return additive_mask(visible)
    return chain_plan(visible, r, s, t, cfg.n_heads, cfg.n_kv_heads, cfg.hd, visible.device, cfg.attn_softcap)


def listed(x: StaticInputs, cfg, dtype: torch.dtype) -> NativePlan | None:
    """A drafter level's lists as the list attention's plan (what `native_plan` would make of their mask: the plan is
    the lists), where the step attends over lists (`attention_path`); else None."""
    if x.lists is None or attention_path(dtype, x.tokens.device, cfg.attn_softcap) != "native":
        return None
    r, s = x.tokens.shape
    return NativePlan(*x.lists, torch.empty(r, s, cfg.n_heads, cfg.hd, dtype=dtype, device=x.tokens.device),
                      softcap=cfg.attn_softcap)


def step_attention(x: StaticInputs, cfg, h: torch.Tensor, t: int):
    """What a step's blocks attend with over T = `t` slots: a drafter level's lists (`listed`); on CUDA with the
    Triton kernels the list plan of its `visibility` in one pass, no mask made (`step_plan`: the same lists), where no
    key is hidden; else the mask's (`step_mask`)."""
    if (lists := listed(x, cfg, h.dtype)) is not None:
        return lists
    if (kernel_choice.one_pass(h) and attention_path(h.dtype, h.device, cfg.attn_softcap) == "native"
            and x.key_mask is None):  # (step_plan sees every committed slot)
        r, s = x.tokens.shape
        idx, count, shared = torch.ops.specgen.step_plan(x.meta[0], x.tree, t)
        return NativePlan(idx, count, shared, torch.empty(r, s, cfg.n_heads, cfg.hd, dtype=h.dtype, device=h.device),
                          softcap=cfg.attn_softcap)
    return step_mask(visibility(x, t), cfg, h.dtype)


def local_attention(x: StaticInputs, cfg, h: torch.Tensor, t: int):
    """What a step's local (sliding) layers attend with over T = `t` slots: `visibility` and the window by token
    positions (a node's and each slot's: `key_positions`), through `step_mask` (on CUDA the list plan of that mask,
    `attention_plan`'s Triton twin: no host read). A node still sees its own slot (its own position). A target's
    trees on the chunked path stay eager (`StepGraphs.servable`): chain_plan's slots are its chains' positions."""
    if x.lists is not None:  # a drafter level's lists: EAGLE's drafter attends fully (eagle.drafter_config)
        raise ValueError("a drafter level's lists carry no sliding window")
    near = in_window(x.positions, key_positions(x.meta[0], x.positions, t), cfg.window)  # [R, 1, S, T]
    return step_mask(visibility(x, t) & near, cfg, h.dtype)


def step_masks(x: StaticInputs, module, h: torch.Tensor, t: int) -> list:
    """Each layer's mask or plan of a step over T = `t` slots: `step_attention`'s, and with a window the local
    layers' (`local_attention`), each made once (as transformer.layer_masks)."""
    cfg = module.cfg
    full = step_attention(x, cfg, h, t)
    if not cfg.window:
        return [full] * len(module.layers)
    local = local_attention(x, cfg, h, t)
    return [local if i in cfg.local_layers else full for i in range(len(module.layers))]


def blocks(module, h: torch.Tensor, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross,
           width: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A Transformer's or EAGLE drafter's blocks on one bucket over its input embeddings h [R, S, dim], reading the
    cache's first `width` slots (None: all; slots past a row's own add exact zeros, so any width that holds them
    gives the same bits): their output as (x, f), x + f unsummed (f None: x is it), [R, S, dim] each."""
    width = width or k.shape[3]
    rots = layer_rotations(module, x.rotation or rows_rotation(module.rope_table[x.positions].to(h.dtype),
                                                               module.cfg.rope_layout), x.positions)
    masks = step_masks(x, module, h, width)
    cache, r = StaticCache(x, k, v, width), x.tokens.shape[0]
    # each layer's condition K/V: the bucket's first R rows of the static buffer
    conds = [None] * len(module.layers) if cross is None else [(ck[:r], cv[:r]) for ck, cv in cross]
    with static_routing():  # routed experts (models/moe.py) by their shape-static path: the routed one's bits
        if deferrable(module.cfg, h, module.layers[0].ffn_norm):  # each residual add in the next norm
            f = None
            for i, (blk, cond) in enumerate(zip(module.layers, conds)):
                h, f = blk.deferred(h, f, rots[i], i, cache, masks[i], False, cond)
            return h, f
        for i, (blk, cond) in enumerate(zip(module.layers, conds)):
            h = blk(h, rots[i], i, cache, masks[i], False, cond)
        return h, None


def target_step(model, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross,
                width: int | None = None, embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """A Transformer's cached forward on one bucket: logits [R, S, V] and hidden [R, S, dim]; device ops only.
    `embeds` [R, S, dim]: the input embeddings in place of the tokens' (a prompt of one embedding: `first_node`)."""
    h, f = blocks(model, model.embed(x.tokens) if embeds is None else embeds, x, k, v, cross, width)
    n = model.norm
    hidden = n(h) if f is None else torch.ops.specgen.add_rms_norm(h, f, n.weight, n.eps)[1]
    return model.logits(hidden), hidden


def first_node(model, embeds: torch.Tensor, cross=None) -> tuple[torch.Tensor, ...]:
    """R rows' first node, at position 0, over their input embeddings [R, 1, dim] (and conditions' K/V `cross`), as a
    captured step computes it (`target_step`: device ops only) over a cache of its own: a node at position 0 sees only
    its own slot, so its keys and values are the same in any row's slot 0 (a prompt of one embedding: a mesh's start,
    a class label). Logits [R, 1, V], hidden [R, 1, dim], keys and values [L, R, Hkv, 1, hd] for the rows' slot 0."""
    r, cfg = embeds.shape[0], model.cfg
    x = StaticInputs.for_bucket(Bucket(r, 1, MIN_WIDTH), embeds.device)  # token 0 at position 0, each row length 0
    x.meta[1].copy_(torch.arange(r, device=embeds.device))  # row i writes cache row i
    k = torch.zeros(cfg.n_layers, r + 1, cfg.n_kv_heads, MIN_WIDTH, cfg.hd, dtype=embeds.dtype, device=embeds.device)
    v = torch.zeros_like(k)  # [L, R + 1, Hkv, W, hd]: the rows and the scratch row (no padding row here)
    logits, hidden = target_step(model, x, k, v, cross, MIN_WIDTH, embeds)
    return logits, hidden, k[:, :r, :, :1], v[:, :r, :, :1]


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


def roots_then(step: Callable[[], tuple], x: StaticInputs, then: Callable) -> tuple[torch.Tensor, ...]:
    """A drafter's catch-up `step` and what runs on its result, in one program: the step's hidden [R, S, D] at each
    row's `last` node ([R, 1, D]: its tree's root) and the staged host ints `extra` [E] go to `then` (a tree growth,
    methods/eagle.py), whose outputs are returned."""
    hidden = step()[0]
    r, _, d = hidden.shape
    return then(torch.gather(hidden, 1, x.last[:, None, None].expand(r, 1, d)), x.extra)
