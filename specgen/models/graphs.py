"""Decode steps (forwards, tree growths, XSpecMesh heads) captured as CUDA graphs and replayed (static_step.py)."""

from __future__ import annotations

import re
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

import torch

from specgen.devices import copy_into, int_tensor
from specgen.errors import UsageError
from specgen.models import kernel_choice
from specgen.models.cache import KVCache
from specgen.models.eagle import EagleNet
from specgen.models.heads import XSpecMeshHeads, head_logits
from specgen.models.kernel_choice import attention_path
from specgen.models.sliced_linear import PROMPT_SLICE_ROWS, SLICE_ROWS, SlicedLinear
from specgen.models.static_step import (MIN_WIDTH, Bucket, StaticInputs, eagle_step, meta_rows, roots_then,
                                        target_step)
from specgen.models.transformer import Transformer

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PROMPT_NODES = (PROMPT_SLICE_ROWS,)  # a prompt's captured chunks: one bucket, one GEMM a product (prompt mode)
MODES = ("auto", "on", "off")


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


class HostInputs(Protocol):
    """A drafter forward's inputs built on the host, as the decoding loop makes them (decoding/verify.HostBatch)."""

    tokens: list[list[int]]  # [n][S]
    positions: list[list[int]]  # [n][S]
    sizes: tuple[int, ...]  # [n]: real nodes a row

    def tree_mask(self) -> torch.Tensor | None:
        """[n, S, S] on the host; None: equal chains (causal)."""


class RootsNext(Protocol):
    """What a drafter's captured catch-up runs on its roots in the same replay (a tree growth: methods/eagle.py):
    hashable, as it keys the captures with the bucket."""

    extra: int  # the host ints it reads, staged with the catch-up's inputs

    def __call__(self, roots: torch.Tensor, ints: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """roots [R, 1, D] (each catch-up row's last node), ints [extra] -> its outputs; device ops only."""


class StepGraphs:
    """A module's static cache and its captured steps, one CUDA graph per bucket (`capture=False`: the same static
    step run eagerly, which is what the CPU tests exercise). Invariants (tests/models/test_graphs.py): no host reads
    inside a step; shapes depend only on the bucket; a query's sums do not depend on the cache width T (so a step
    reads only its bucket's `width`)."""

    def __init__(self, model, kind: StepKind, capture: bool = True, strict: bool = False,
                 nodes: tuple[int, ...] = NODE_BUCKETS) -> None:
        self.model, self.kind, self.capture, self.nodes = model, kind, capture, nodes  # nodes: a call's node buckets
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
        need = -(-(max_len + self.nodes[-1]) // 512) * 512
        if self.k is None or batch > self.capacity or need > self.k.shape[3]:
            rows, need = max(batch, self.capacity), max(need, 0 if self.k is None else self.k.shape[3])
            self.reset()
            cfg = self.model.cfg
            base = KVCache.allocate(cfg.n_layers, rows + 1, cfg.n_kv_heads, need, cfg.hd, self.dtype, self.device)
            self.k, self.v = base.k, base.v
        cache = KVCache(self.k[:, :batch], self.v[:, :batch], [0] * batch)
        if self.cross is not None:
            cache.cross = [(k[:batch], v[:batch]) for k, v in self.cross]
        if self.key_mask is not None:  # every row the batch admits writes its own (`KVCache.absorb`)
            cache.key_mask = self.key_mask[:batch]
        return cache

    def reset(self) -> None:
        """Drop the captures and the static buffers (a larger cache was asked for, or the weights a capture reads)."""
        self.graphs.clear()  # their pool goes with them: the next capture opens a new one
        self.recorded += self.prompts.captures if self.prompts is not None else 0  # what they cost stays counted
        self.prompts = None
        self.k = self.v = None  # [L, C + 1, Hkv, T, D]: C cache rows and one scratch row for padding rows
        self.cross = None  # per layer (k, v) [C, H, M, D]: the conditions (cross-attention models)
        self.key_mask = None  # [C, M] bool: each row's first M committed slots its queries see (t2i: `adopt_key_mask`)
        self.pool, self.graph_bytes = None, 0  # the captures' memory pool, and the device memory it holds
        # what a caller's captures read besides their staged inputs (XSpecMesh's stacked heads, their stage), kept here
        # for later callers to replay them, and dropped with them
        self.held: dict = {}

    def forget(self, posts: list) -> None:
        """Drop the captures whose post-step is one of `posts` (their owner replaced them: XSpecMesh's held statics);
        each holds its graph and what its post-step reads."""
        gone = {id(post) for post in posts}  # by identity: a post-step's equality is its own
        for key in [k for k in self.graphs if isinstance(k, tuple) and len(k) == 2 and id(k[1]) in gone]:
            del self.graphs[key]

    def bucket(self, n: int, s: int, filled: int) -> Bucket | None:
        """The bucket of n rows by s nodes over rows holding up to `filled` slots; None: none holds it (eager)."""
        rows = min(next((r for r in ROW_BUCKETS if r >= n), n), self.capacity)
        nodes = next((m for m in self.nodes if m >= s), None)
        if nodes is not None and self.fill % rows == 0:  # padding nodes up to a whole slice: a padding node costs
            nodes = max(nodes, self.fill // rows)  # one query over its own slot, a product's row copy one launch
        if n > ROW_BUCKETS[-1] or nodes is None or filled + nodes > self.k.shape[3]:
            return None
        return Bucket(rows, nodes, self.width(filled + nodes))

    def width(self, slots: int) -> int:
        """The narrowest width bucket (MIN_WIDTH, doubling, at most the static buffer's) that holds `slots` slots."""
        return min(max(MIN_WIDTH, 1 << (slots - 1).bit_length()), self.k.shape[3])

    def forward(self, tokens: torch.Tensor | list, positions: torch.Tensor | list, cache: KVCache,
                tree_mask: torch.Tensor | None, branches: int = 1,
                post: Callable | None = None) -> tuple[torch.Tensor, ...] | None:
        """The step's outputs for the real part by a replay, or None where this call must run eagerly. tokens,
        positions [n, S] (and a [n, S, S] tree mask) are per sequence, each sequence run on its `branches`
        consecutive cache rows; as nested lists (built on the host) they go in with the bucket's meta in one copy.
        `post` (hashable: it keys the captures) maps the step's outputs inside the replay (CFG's combine:
        image/target.py). An output's real rows are the n * branches rows, or n where `post` made one a sequence."""
        host = isinstance(tokens, list)
        n, s = (len(tokens), len(tokens[0])) if host else tokens.shape

        def stage(x: StaticInputs, b: Bucket) -> None:
            if host:  # built on the host (a verify's, an AR step's): tokens, positions and meta in one copy
                self.stage_host(x, b, tokens, positions, cache, [0] * b.rows, branches)
                return
            real_tokens, real_positions = x.real(n, s, branches)[:2]  # made on the device (run_ahead, a growth)
            real_tokens.copy_(tokens)
            real_positions.copy_(positions)
            copy_into(x.meta, int_tensor(meta_rows(cache.lengths, n * branches, b.rows, self.capacity)))

        return self.replay(n, s, cache, tree_mask, None, branches, post, stage)

    def catch_up(self, batch: HostInputs, cache: KVCache, features: torch.Tensor, then: RootsNext,
                 ints: list[int]) -> tuple[torch.Tensor, ...] | None:
        """An EAGLE drafter's catch-up over inputs built on the host (`host_batch`) and what runs on its result (its
        tree growth), in one replay: tokens, positions, the bucket's meta, each row's last real node (`sizes` - 1) and
        `then`'s host `ints` staged in one copy from page-locked memory; the features [n, S, D] (any dtype: the copy
        casts them). Each row's predicted features at its last node, the roots [R, 1, D], go with the staged ints to
        `then` inside the replay (`static_step.roots_then`); its outputs are the graph's own buffers (read them before
        this module's next call). None where this call must run eagerly."""
        n, s = len(batch.tokens), len(batch.tokens[0])

        def stage(x: StaticInputs, b: Bucket) -> None:
            last = [m - 1 for m in batch.sizes] + [0] * (b.rows - n)  # a padding row: its node 0's (finite)
            self.stage_host(x, b, batch.tokens, batch.positions, cache, last + ints)
            x.real(n, s)[2].copy_(features)

        return self.replay(n, s, cache, batch.tree_mask(), features.shape[-1], 1, None, stage, then)

    def stage_host(self, x: StaticInputs, b: Bucket, tokens: list, positions: list, cache: KVCache, last: list,
                   branches: int = 1) -> None:
        """Inputs built on the host into the bucket's int buffer in one copy from page-locked memory: tokens and
        positions [n][S] (each sequence's on its `branches` rows), the meta of its rows, and `last` [R] (a catch-up's:
        then its growth's `extra` ints). Padding nodes and rows get token 0 at position 0 (finite, seen by no real
        node)."""
        rows, s = len(tokens) * branches, len(tokens[0])
        pad, pad_rows = [0] * (b.nodes - s), [0] * (b.nodes * (b.rows - rows))
        def block(t: list) -> list:  # [R * S]: each sequence's padded row on its branch rows, then the padding rows
            out = []
            for row in t:
                out += (row + pad) * branches
            return out + pad_rows
        meta = meta_rows(cache.lengths, rows, b.rows, self.capacity)
        copy_into(x.ints, int_tensor(block(tokens) + block(positions) + meta[0] + meta[1] + last))

    def replay(self, n: int, s: int, cache: KVCache, tree_mask: torch.Tensor | None, feature_dim: int | None,
               branches: int, post: Callable | None, stage: Callable[[StaticInputs, Bucket], None],
               then: RootsNext | None = None):
        """`forward`'s and `catch_up`'s replay: the bucket's buffers, `stage`d by the caller (its tokens, positions,
        meta and features) and here (its tree), the step (and `post`) replayed, the real part of its outputs; given
        `then` (a drafter's catch-up), the step's roots go to it inside the replay, and its outputs are returned as the
        graph holds them."""
        rows = n * branches
        b = self.bucket(rows, s, max(cache.lengths)) if self.servable(cache, tree_mask) else None
        if b is None:
            self.eager_calls += 1
            return None
        key = b if post is None and then is None else (b, post if then is None else then)
        x = self.graphs[key][0] if key in self.graphs else StaticInputs.for_bucket(
            b, self.device, None if feature_dim is None else (feature_dim, self.dtype),
            None if self.key_mask is None else self.key_mask[: b.rows], 0 if then is None else then.extra)
        stage(x, b)
        self.stage_tree(x, n, s, branches, tree_mask)
        step = lambda: self.kind.step(self.model, x, self.k, self.v, self.cross, b.width)  # noqa: E731
        outs = self.run(key, x, partial(roots_then, step, x, then) if then is not None else
                        step if post is None else lambda: post(*step()),
                        f"bucket of {b.rows} rows x {b.nodes} nodes over {b.width} slots")
        if then is not None:  # a catch-up's growth: its outputs as the graph holds them (no views to make)
            return outs
        real = [(o, rows if o.shape[0] == b.rows else n) for o in outs]
        outs = tuple(o if o.shape[:2] == (r, s) else o[:r, :s] for o, r in real)  # a slice is a host op: none unpadded
        return tuple(o.clone() for o in outs) if self.kind.kept else outs

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A prompt tokens [1, P] into the empty row `cache` holds (any row of the static buffer) as chunks of
        PROMPT_NODES[-1] nodes, each a captured chain step over a one-row buffer of the prompts' own, whose keys and
        values are then copied into the row and committed: the last node's logits [1, 1, V] and every node's hidden
        states [1, P, dim]; None where a prompt attends otherwise than a step (`prompts_as_steps`: one eager forward
        then). Run in prompt mode, as the eager forward is (its products' slices: sliced_linear.PROMPT_SLICE_ROWS).
        The bits are one eager forward's: a query's sums do not depend on how many queries a forward holds."""
        if tokens.shape[0] != 1 or cache.lengths != [0] or not kernel_choice.prompts_as_steps(self.dtype, self.device):
            return None
        p, most = tokens.shape[1], PROMPT_NODES[-1]
        own = self.prompt_graphs().new_cache(1, p)
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

    def prompt_graphs(self) -> "StepGraphs":
        """The prompts' own captures, buffer and memory pool (made on first use: a text prompt's chunks, `prefill`; a
        mesh's encoder and start, a class label's position: `static_step.first_node`): a prompt's outputs outlive the
        steps' replays, and the steps' new captures (`adopt_cross`, `adopt_key_mask`) leave them be."""
        if self.prompts is None:
            self.prompts = StepGraphs(self.model, self.kind, self.capture, self.strict, PROMPT_NODES)
        return self.prompts

    def call(self, key: tuple, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
             shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[torch.Tensor, ...]:
        """`fn(**static)` over static copies of `inputs` on the module's device, whose shapes `key` fixes: a replay of
        the key's graph (captured on its first call). An input named in `shapes` fills the leading block of a buffer of
        that shape (the rest keeps what an earlier call left: zeros at first). An input on the host is copied in
        straight from page-locked memory, without waiting (`devices.copy_into`). The outputs are the graph's own
        buffers, in the pool all this module's graphs share (another graph's replay may write them): read them before
        this module's next call or forward."""
        shapes = shapes or {}
        static = self.graphs[key][0] if key in self.graphs else {
            n: torch.zeros(shapes.get(n, t.shape), dtype=t.dtype, device=self.device) for n, t in inputs.items()}
        for name, t in inputs.items():
            copy_into(static[name][tuple(map(slice, t.shape))] if name in shapes else static[name], t)
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
        """Whether a call runs on the static buffer: its cache is the buffer's first rows, conditions and hidden keys
        in the static buffers, and neither a target tree nor hidden keys on the chunked attention (StepKind)."""
        if self.k is None or cache.k.data_ptr() != self.k.data_ptr():
            return False
        if ((cache.key_mask is not None or (tree_mask is not None and self.kind.exact_trees))
                and attention_path(self.dtype, self.device, self.model.cfg.attn_softcap) == "chunked"):
            return False  # the chunked chain plan puts a tree node's keys where the cache has them, not in AR's order,
            # and sees every committed slot
        if cache.cross is not None:
            self.adopt_cross(cache)
        if cache.key_mask is not None:
            self.adopt_key_mask(cache)
        return True

    def adopt_cross(self, cache: KVCache) -> None:
        """Keep the conditions in static buffers: copy them in when the loop's cache holds its own tensors."""
        if self.cross is not None and cache.cross[0][0].data_ptr() == self.cross[0][0].data_ptr():
            return
        shape = cache.cross[0][0].shape[1:]
        if self.cross is None or self.cross[0][0].shape[1:] != shape:
            self.graphs.clear()
            self.pool = None
            with torch.inference_mode(False):  # normal tensors: the loop writes rows of them outside inference mode
                self.cross = [(k.new_zeros(self.capacity, *shape), v.new_zeros(self.capacity, *shape))
                              for k, v in cache.cross]
        rows = cache.cross[0][0].shape[0]
        for (k, v), (ck, cv) in zip(self.cross, cache.cross):
            k[:rows].copy_(ck)
            v[:rows].copy_(cv)
        cache.cross = [(k[:rows], v[:rows]) for k, v in self.cross]

    def adopt_key_mask(self, cache: KVCache) -> None:
        """Keep the rows' hidden keys (a t2i caption's padding: `KVCache.key_mask`) in a static buffer the steps read:
        copy them in when the loop's cache holds its own."""
        mask = cache.key_mask  # [B, M]
        if self.key_mask is not None and mask.data_ptr() == self.key_mask.data_ptr():
            return
        if self.key_mask is None or self.key_mask.shape[1] != mask.shape[1]:
            self.graphs.clear()  # the steps captured so far read none, or another width
            self.pool = None
            with torch.inference_mode(False):  # a normal tensor: the loop writes rows of it (`KVCache.absorb`)
                self.key_mask = mask.new_ones(self.capacity, mask.shape[1])
        self.key_mask[: mask.shape[0]].copy_(mask)
        cache.key_mask = self.key_mask[: mask.shape[0]]

    def stage_tree(self, x: StaticInputs, n: int, s: int, branches: int, tree_mask: torch.Tensor | None) -> None:
        """Copy a call's tree mask (per sequence: `forward`; None: a chain) into the bucket's. Padding nodes and rows
        keep what an earlier call left in the token, position and feature buffers (a valid token and position, a
        finite feature): no real node sees a padding node's slot (outside the real part the tree rows are the bucket's
        causal base, where no node sees a later one) and a padding row writes into the scratch row, so a real node's
        bits do not depend on them. A chain of any length reads the causal base as it is: no copy (a chain's length
        changes every step)."""
        if tree_mask is None:
            if x.dirty is not None:  # a tree's mask is in it
                x.tree.copy_(x.causal)
                x.dirty = None
            return
        rows = n * branches
        if x.dirty is not None and (rows < x.dirty[0] or s < x.dirty[1]):  # the last tree reaches past this one
            x.tree.copy_(x.causal)
        x.dirty = (rows, s)
        real = x.real(n, s, branches)[3]  # [br, n, s, s]
        if tree_mask.device == real.device:
            real.copy_(tree_mask)
        else:  # a host mask whole, its branch rows repeated there (a broadcast from the host would wait)
            copy_into(real, tree_mask.expand(real.shape).contiguous())

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


@contextmanager
def masked_call(graphs: StepGraphs | None, mask: torch.Tensor, key: tuple, fn: Callable[..., tuple],
                inputs: dict[str, torch.Tensor]) -> tuple:
    """`fn(**inputs)`, a step that writes the key mask `mask`, as a replay of `graphs` (`StepGraphs.call`) where its
    captures read that mask (`adopt_key_mask` made it their static buffer); else run as it is (no captures, or the
    mask is still the loop's own)."""
    if graphs is None or graphs.key_mask is None or mask.data_ptr() != graphs.key_mask.data_ptr():
        return fn(**inputs)
    return graphs.call(key, fn, inputs)


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
