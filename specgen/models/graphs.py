"""Captured decode steps: a Transformer's cached forwards (AR steps, verifies) as CUDA-graph replays per bucket.

`attach(model, mode)` gives a model a `StepGraphs`; from then on `Transformer.forward` over a cache goes through
`StepGraphs.forward`, which pads the call to a bucket (rows, nodes), copies its inputs into the bucket's static
buffers and replays the bucket's graph (captured on first use). Prefill stays eager. Why CUDA graphs and not
`torch.compile(mode="reduce-overhead")`: the step is the model's own eager code captured as it is, so the captured
forward computes what the eager one computes kernel for kernel, with no compiler that fuses or reorders a reduction,
and no compile time at start-up.

Invariants of the step function (`static_forward`; tests/models/test_graphs.py checks them on the CPU):
- It reads nothing on the host. Inputs live in static device buffers (tokens, positions, row lengths, the tree
  mask, the cache row each input row writes); the attention mask and the cache-write index are computed from them on
  the device, and the cache is the whole static buffer: every forward attends over all T slots of its rows.
- Its shapes depend only on the bucket. Padding rows write into a scratch row of the cache, padding nodes see only
  themselves and their row's committed slots; neither is returned or committed.
- A query's sums do not depend on T: in the chunked attention (low precision) hidden slots add exact zeros in a fixed
  chunk order aligned at slot 0, and in float32 SDPA hidden slots are -inf. A bucket is shared by AR steps and
  verifies of the same padded shape.
- Trees in low precision are left eager: the chunked attention is exact there only in AR's key layout
  (`attention.tree_attention`), which a static step does not build.

The cache the loop sees is a view over the static buffer's first rows (`new_cache`), so eager prefills and commits
land where the graphs read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from specgen.decoding.cache import KVCache
from specgen.errors import UsageError
from specgen.models.attention import chain_plan
from specgen.models.rope import rotation
from specgen.models.transformer import additive_mask

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Bucket:
    """A captured shape: `rows` cache rows (CFG branches counted) by `nodes` new nodes each."""

    rows: int
    nodes: int


class StaticInputs:
    """One bucket's input buffers on the device; a call copies its real part in and pads the rest."""

    def __init__(self, b: Bucket, device) -> None:
        self.tokens = torch.zeros(b.rows, b.nodes, dtype=torch.long, device=device)  # [R, S]
        self.positions = torch.zeros(b.rows, b.nodes, dtype=torch.long, device=device)  # [R, S]
        self.meta = torch.zeros(2, b.rows, dtype=torch.long, device=device)  # [2, R]: lengths, cache row written
        self.tree = torch.zeros(b.rows, b.nodes, b.nodes, dtype=torch.bool, device=device)  # [R, S, S]
        self.eye = torch.eye(b.nodes, dtype=torch.bool, device=device).expand(b.rows, -1, -1)  # padding: itself
        self.causal = torch.ones(b.nodes, b.nodes, dtype=torch.bool, device=device).tril()


class StaticCache:
    """The cache as a captured forward sees it: writes go to device-computed slots, reads see all T slots."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor, rows: int) -> None:
        self.k, self.v, self.index, self.rows = k, v, index, rows  # k, v [L, C + 1, Hkv, T, D]; index [R*Hkv*S]

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store [R, Hkv, S, D] at the index's slots; return rows [0, R) over every slot [R, Hkv, T, D]."""
        k, v = self.k[layer], self.v[layer]
        d = k_new.shape[-1]
        k.view(-1, d).index_copy_(0, self.index, k_new.reshape(-1, d))
        v.view(-1, d).index_copy_(0, self.index, v_new.reshape(-1, d))
        return k[: self.rows], v[: self.rows]


def static_forward(model, x: StaticInputs, k: torch.Tensor, v: torch.Tensor, cross) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [R, S, V] and hidden [R, S, dim] of one bucket's inputs: device ops only (see the module doc)."""
    cfg = model.cfg
    r, s = x.tokens.shape
    t = k.shape[3]
    lengths, write_rows = x.meta[0], x.meta[1]  # [R], [R]
    dev = x.tokens.device
    # 1. embeddings and the RoPE rotation of the bucket's positions
    h = model.tok_embeddings(x.tokens)  # [R, S, dim]
    rot = rotation(model.rope_table[x.positions].to(h.dtype), cfg.rope_layout)
    # 2. what each node sees: its row's committed slots, and pending slots by the tree mask
    rel = torch.arange(t, device=dev)[None, :] - lengths[:, None]  # [R, T]: slot - row length
    pending = x.tree.gather(2, rel.clamp(0, s - 1)[:, None, :].expand(r, s, t))  # [R, S, T]
    visible = ((pending & ((rel >= 0) & (rel < s))[:, None, :]) | (rel < 0)[:, None, :]).unsqueeze(1)  # [R, 1, S, T]
    if h.dtype == torch.float32:
        mask = additive_mask(visible)
    else:
        mask = chain_plan(visible, r, s, t, cfg.n_heads, cfg.n_kv_heads, cfg.hd, dev)
    # 3. where each node's key and value go: row write_rows[b], slot lengths[b] + j, in a layer's flat rows
    hkv = k.shape[2]
    slots = lengths[:, None] + torch.arange(s, device=dev)  # [R, S]
    base = (write_rows[:, None] * hkv + torch.arange(hkv, device=dev)) * t  # [R, Hkv]
    cache = StaticCache(k, v, (base[:, :, None] + slots[:, None, :]).reshape(-1), r)
    # 4. the blocks, the final norm and the head
    for i, blk in enumerate(model.layers):
        h = blk(h, rot, i, cache, mask, False, None if cross is None else cross[i])
    hidden = model.norm(h)
    return model.output(hidden), hidden


class StepGraphs:
    """A model's static cache and its captured steps, one CUDA graph per bucket (`capture=False`: the same static
    step run eagerly, which is what the CPU tests exercise)."""

    def __init__(self, model, capture: bool = True) -> None:
        self.model, self.capture = model, capture
        self.k = self.v = None  # [L, C + 1, Hkv, T, D]: C cache rows and one scratch row for padding rows
        self.cross = None  # per layer (k, v) [C, H, M, D]: the conditions (cross-attention models)
        self.graphs: dict[Bucket, tuple] = {}  # bucket -> (inputs, graph or None, logits, hidden)
        self.pool = None
        self.graph_bytes = 0  # device memory the captures took
        self.replays = 0
        self.eager_calls = 0

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[1] - 1

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache over the static buffer's first `batch` rows, with room for the largest node bucket's padding."""
        need = max_len + NODE_BUCKETS[-1]
        if self.k is None or batch > self.capacity or need > self.k.shape[3]:
            self.reset()
            cfg = self.model.cfg
            base = KVCache.allocate(cfg.n_layers, batch + 1, cfg.n_kv_heads, need, cfg.hd, self.model.dtype,
                                    self.model.device)
            self.k, self.v = base.k, base.v
        cache = KVCache(self.k[:, :batch], self.v[:, :batch], [0] * batch)
        if self.cross is not None:
            cache.cross = [(k[:batch], v[:batch]) for k, v in self.cross]
        return cache

    def reset(self) -> None:
        """Drop the captures and the static buffers (a larger cache was asked for)."""
        self.graphs.clear()
        self.k = self.v = self.cross = None
        self.graph_bytes = 0

    def bucket(self, n: int, s: int) -> Bucket | None:
        rows = next((r for r in ROW_BUCKETS if r >= n), None)
        nodes = next((m for m in NODE_BUCKETS if m >= s), None)
        if rows is None or nodes is None:
            return None
        return Bucket(min(rows, self.capacity), nodes)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                tree_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Logits [n, S, V] and hidden [n, S, dim] by a replay, or None where this call must run eagerly."""
        n, s = tokens.shape
        b = self.bucket(n, s) if self.servable(cache, tree_mask) else None
        if b is None or max(cache.lengths) + b.nodes > self.k.shape[3]:
            self.eager_calls += 1
            return None
        x, graph, logits, hidden = self.graphs.get(b) or (StaticInputs(b, tokens.device), None, None, None)
        self.stage(x, b, tokens, positions, cache.lengths, tree_mask)
        if graph is None and logits is None:
            logits, hidden, graph = self.record(x, b)
            self.graphs[b] = (x, graph, logits, hidden)
        elif graph is not None:
            graph.replay()
        else:
            logits, hidden = static_forward(self.model, x, self.k, self.v, self.cross)
        self.replays += 1
        return logits[:n, :s].clone(), hidden[:n, :s].clone()

    def servable(self, cache: KVCache, tree_mask: torch.Tensor | None) -> bool:
        """Whether a call runs on the static buffer: its cache is the buffer's first rows, no key mask (t2i captions
        stay eager), conditions in the static buffers, and no low-precision tree (module doc)."""
        if self.k is None or cache.k.data_ptr() != self.k.data_ptr() or cache.key_mask is not None:
            return False
        if tree_mask is not None and self.model.dtype != torch.float32:
            return False
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
            self.cross = [(k.new_zeros(self.capacity, *shape), v.new_zeros(self.capacity, *shape))
                          for k, v in cache.cross]
        rows = cache.cross[0][0].shape[0]
        for (k, v), (ck, cv) in zip(self.cross, cache.cross):
            k[:rows].copy_(ck)
            v[:rows].copy_(cv)
        cache.cross = [(k[:rows], v[:rows]) for k, v in self.cross]

    def stage(self, x: StaticInputs, b: Bucket, tokens, positions, lengths: list[int], tree_mask) -> None:
        """Copy a call's inputs into the bucket's buffers: real rows and nodes first, padding after them."""
        n, s = tokens.shape
        x.tokens.zero_()
        x.tokens[:n, :s].copy_(tokens)
        x.positions.zero_()
        x.positions[:n, :s].copy_(positions)
        rows = list(range(n)) + [self.capacity] * (b.rows - n)  # padding rows write into the scratch row
        meta = torch.tensor([list(lengths) + [0] * (b.rows - n), rows], dtype=torch.long)
        x.meta.copy_(meta.pin_memory() if x.meta.is_cuda else meta, non_blocking=True)
        x.tree.copy_(x.eye)
        x.tree[:n, :s, :s].copy_(x.causal[:s, :s] if tree_mask is None else tree_mask.expand(n, s, s))

    def record(self, x: StaticInputs, b: Bucket):
        """The bucket's first call: run it (warm-up) and capture it; (logits, hidden, graph)."""
        if not self.capture:
            logits, hidden = static_forward(self.model, x, self.k, self.v, self.cross)
            return logits, hidden, None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: lazy initialisations happen outside the capture
            static_forward(self.model, x, self.k, self.v, self.cross)
        torch.cuda.current_stream().wait_stream(stream)
        before = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                logits, hidden = static_forward(self.model, x, self.k, self.v, self.cross)
        except torch.cuda.OutOfMemoryError:
            free = torch.cuda.mem_get_info()[0]
            raise UsageError(f"--graphs: bucket of {b.rows} rows x {b.nodes} nodes does not fit in the GPU's "
                             f"{free} free bytes; use --graphs off or a smaller --batch-size") from None
        self.graph_bytes += torch.cuda.memory_reserved() - before
        graph.replay()
        return logits, hidden, graph

    def describe(self) -> dict:
        """What the captures hold, for a benchmark's machine column."""
        return {"graphs": len(self.graphs), "graph_mb": round(self.graph_bytes / 2**20, 1), "replays": self.replays,
                "eager_calls": self.eager_calls}


def attach(model, mode: str = "auto", capture: bool | None = None) -> StepGraphs | None:
    """Give `model` captured steps per `mode` (auto: on CUDA; on: CUDA or a one-line refusal; off: none); a model
    on CUDA that cannot capture runs eagerly with one warning. `capture=False` runs the static steps uncaptured."""
    if mode not in MODES:
        raise UsageError(f"--graphs {mode!r}: use one of {', '.join(MODES)}")
    on_cuda = model.device.type == "cuda"
    if mode == "on" and not on_cuda and capture is not False:
        raise UsageError("--graphs on needs a CUDA device (CUDA graphs); on a CPU use --graphs auto or off")
    if mode == "off" or (mode == "auto" and not on_cuda and capture is not False):
        model.graphs = None
        return None
    if on_cuda and not hasattr(torch.cuda, "CUDAGraph"):
        warnings.warn("this torch build cannot capture CUDA graphs: decoding runs eagerly", stacklevel=2)
        model.graphs = None
        return None
    model.graphs = StepGraphs(model, capture=on_cuda if capture is None else capture)
    return model.graphs
