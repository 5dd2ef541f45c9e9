"""The native ops' CUDA implementations: the list attention (`attention_plan`, `attend`), the norms, RoPE, the
products and SwiGLU's gate, and a tree growth's tail (`kept_tree`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

BLOCK_N = 64  # list entries (keys) per attention tile (triton_kernels.attend_lists)
WARPS = 4
GATE_BLOCK = 1024  # elements a program of silu_mul
PLAN_BLOCK = 128  # slots a step of plan_rows' passes
CHILD_BLOCK = 2048  # vocabulary entries a step of top_children's pass
GUIDE_BLOCK = 1024  # vocabulary entries a program of guided_rows
TREE_CHUNK = 512  # nodes a step of kept_tree_rows' selection (N ~1,300 at the widest: three steps)
TREE_ROWS = 16  # mask rows a step of kept_tree_rows
BEAM_FEATURES = 128  # feature columns a step of beam_rows' gather of the next level's inputs
COMMIT_BLOCK = 32  # moves a step of commit_rows


@functools.cache
def available() -> bool:
    """Whether the Triton kernels run here: Triton importable (it ships with torch's CUDA builds; checked without
    importing it) and `SPECGEN_NATIVE` not 0; where Triton is missing, one warning. Else CUDA forwards take the torch
    paths of docs/precision.md's table."""
    if os.environ.get("SPECGEN_NATIVE", "1") == "0":
        return False
    if importlib.util.find_spec("triton") is None:
        warnings.warn("Triton is not installed: CUDA attention runs as torch ops (slower; float32 on SDPA, whose sums "
                      "move with the forward's shape), see docs/precision.md; `pip install triton` for the list kernel")
        return False
    return True


@functools.cache
def kernels():
    """The Triton kernels (native/triton_kernels.py), imported on first use: `import specgen` never imports Triton."""
    from specgen.native import triton_kernels  # an optional dependency (Triton), imported where a CUDA forward needs it
    return triton_kernels


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, count: torch.Tensor,
           shared: torch.Tensor, out: torch.Tensor, softcap: float = 0.0) -> None:
    """`torch.ops.specgen.attend` on CUDA: q [B, H, S, D] over k, v [B, Hkv, T, D] into out [B, S, H, D], each query
    over its list idx [B, S, T] (the first count [B, S] entries; `shared` is the CPU kernel's and unread here);
    `softcap` > 0: each scaled score s becomes softcap tanh(s / softcap) (Gemma 2)."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    idx = idx if idx.stride(-1) == 1 else idx.contiguous()
    count = count.contiguous()
    b, h, s, d = q.shape
    hkv = k.shape[1]
    kernels().attend_lists[(b * s, hkv)](
        q, k, v, idx, count, out, s, d**-0.5, float(softcap), q.stride(0), q.stride(1), q.stride(2), k.stride(0),
        k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), idx.stride(0), idx.stride(1), out.stride(0),
        out.stride(1), out.stride(2), **tiles(h // hkv, d), CAP=bool(softcap), num_warps=WARPS)


def tiles(group: int, d: int) -> dict[str, int]:
    """The kernel's constexprs for `group` query heads per kv head of width `d`: powers of two, the rows just the
    group (the products are float32 FMA dots, which take any row count: 16 rows for SmolLM2's 3 heads would be 5x the
    work), the width at least 16; fixed per model, so every forward of it runs one compiled kernel."""
    return dict(GROUP=group, D=d, BLOCK_M=pow2(group), BLOCK_D=max(16, pow2(d)), BLOCK=BLOCK_N)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`torch.ops.specgen.rms_norm` on CUDA: weight * RMSNorm_float32(x) rounded to x's dtype ([..., dim])."""
    return add_rms_norm(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, a: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """`torch.ops.specgen.add_rms_norm` on CUDA: (x + a, RMSNorm(x + a)) in one pass, or (RMSNorm(x),) when a is None,
    over the last dim of CUDA tensors of one dtype, each [..., dim]."""
    x = x.contiguous()
    dim = x.shape[-1]
    out, total = torch.empty_like(x), None if a is None else torch.empty_like(x)
    kernels().norm_rows[(x.numel() // dim,)](x, x if a is None else a.contiguous(), weight.contiguous(),
                                             out if total is None else total, out, dim, eps, ADD=a is not None,
                                             BLOCK=max(16, pow2(dim)))
    return (out,) if total is None else (total, out)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool) -> torch.Tensor:
    """`torch.ops.specgen.rope` on CUDA: x [B, H, S, D] rotated by cos, sin [B, 1, S, D] (rope.Rotation's), into a new
    contiguous [B, H, S, D]; the bits of rope.rotate's torch ops (pairs (i, i + D/2) if `half`, else (2i, 2i + 1))."""
    return rope_store(x, cos, sin, None, None, None, x.shape[1], half)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor | None,
               v: torch.Tensor | None, meta: torch.Tensor | None, heads: int, half: bool) -> torch.Tensor:
    """`torch.ops.specgen.rope_store` on CUDA, one pass over a step's qkv [B, Hq + 2 Hkv, S, D]: q rotated as `rope`
    rotates it, into a new [B, Hq, S, D] (returned); k rotated and v as it is, into the cache layer k, v [C, Hkv, T,
    D] at row meta[1, b], slot meta[0, b] + s (static_step.StaticCache's index); k, v, meta None: `rope`, nothing
    stored."""
    x = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    b, h, s, d = x.shape
    cos, sin = cos.expand(b, 1, s, d), sin.expand(b, 1, s, d)  # a table row shared by the batch: stride 0
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:  # the kernel reads both through cos's strides
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(b, heads, s, d, dtype=x.dtype, device=x.device)
    store = k is not None
    k, v, meta = (k, v, meta) if store else (x, x, x)  # unread without STORE
    kernels().rope_rows[(b * h * s,)](x, cos, sin, out, k, v, meta, h, heads, (h - heads) // 2, s, b, x.stride(0),
                                      x.stride(1), x.stride(2), cos.stride(0), cos.stride(2), k.stride(0),
                                      k.stride(1), k.stride(2), D=d, BLOCK_D=max(16, pow2(d)), HALF=half,
                                      STORE=store, enable_fp_fusion=False)  # torch's two roundings (mul, add): no FMA
    return out


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.ops.specgen.silu_mul` on CUDA: SwiGLU's gate silu(a) * b over [..., F] tensors of one shape and dtype,
    into a new contiguous tensor; torch's two roundings (the silu, then the product), each element on its own."""
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    kernels().silu_mul_rows[(-(-a.numel() // GATE_BLOCK),)](a, b, out, a.numel(), BLOCK=GATE_BLOCK)
    return out


def pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def attention_plan(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.ops.specgen.attention_plan` on CUDA (no host read, so a captured step builds it in its graph): the same
    idx [B, S, T], count [B, S] and shared [B] (int32) as attention.c's plan of the bool mask seen [B, S, T], in two
    launches (triton_kernels.plan_rows, then the shared run's minimum over queries)."""
    b, s, t = seen.shape
    return planned(seen, None, b, s, t)


def step_plan(lengths: torch.Tensor, tree: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.ops.specgen.step_plan` on CUDA: `attention_plan` of a step's visibility over T = `t` slots without the
    mask (static_step.visibility: each node sees its row's committed slots, lengths [B], and the pending slots its
    tree row names, tree [B, S, S] bool), in the same two launches."""
    b, s, _ = tree.shape
    return planned(tree, lengths, b, s, t)


def planned(seen: torch.Tensor, lengths: torch.Tensor | None, b: int, s: int,
            t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """plan_rows over a mask [B, S, T] (lengths None) or a step's tree rows [B, S, S] and lengths [B]."""
    on = dict(dtype=torch.int32, device=seen.device)
    idx, count, lead = torch.empty(b, s, t, **on), torch.empty(b, s, **on), torch.empty(b, s, **on)
    if not b * s:  # no query: nothing to plan (a launch needs a program)
        return idx, count, torch.zeros(b, **on)  # as attention.c: no query shares a run
    mask = seen.view(torch.uint8) if seen.dtype == torch.bool else seen
    kernels().plan_rows[(b * s,)](mask, mask if lengths is None else lengths.contiguous(), idx, count, lead, s, t,
                                  *mask.stride(), idx.stride(0), idx.stride(1), BLOCK=PLAN_BLOCK,
                                  TREE=lengths is not None)
    return idx, count, lead.amin(-1)


def guided(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """`torch.ops.specgen.guided` on CUDA, one launch (triton_kernels.guided_rows): CFG's combine of logits [2 n, S, V]
    (rows cond_0, uncond_0, ..) at `scale` -> [n, S, V], image/target.guided's bits."""
    logits = logits.contiguous()
    rows, s, v = logits.shape
    out = logits.new_empty(rows // 2, s, v)
    if out.numel():
        grid = (rows // 2 * s, -(-v // GUIDE_BLOCK))
        kernels().guided_rows[grid](logits, out, s, v, scale, BLOCK=GUIDE_BLOCK, enable_fp_fusion=False)
    return out


def top_children(logits: torch.Tensor, scores: torch.Tensor | None, branches: int, scale: float, k: int,
                 values: torch.Tensor, index: torch.Tensor, at: int) -> None:
    """`torch.ops.specgen.top_children` on CUDA: each node's k best children from a drafter head's logits [n * br, S,
    V] (CFG-guided at `scale` when br is 2): their log-probs plus the node's path score scores [n, S] (None: 0),
    float32, and their tokens, best first, into a growth's record values, index [n, N] (float32, int64) from column
    `at`, [n, S * k] there (triton_kernels.top_children)."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, s, v = logits.shape
    n = rows // branches
    if not n * s:  # no node: nothing to launch
        return
    assert values.stride() == index.stride() and values.stride(1) == 1, "a record's buffers share one row layout"
    scored = scores is not None
    if scored and scores.stride(-1) != 1:
        scores = scores.contiguous()
    kernels().top_children[(n * s,)](logits, scores if scored else values, values, index, s, v, scale,
                                     logits.stride(0), logits.stride(1), scores.stride(0) if scored else 0,
                                     values.stride(0), at, K=k, BLOCK_K=pow2(k), CFG=branches == 2, SCORED=scored,
                                     BLOCK=min(pow2(v), CHILD_BLOCK), enable_fp_fusion=False)


def beam(scores: torch.Tensor, tokens: torch.Tensor, padding: torch.Tensor, parents: torch.Tensor,
         hidden: torch.Tensor, embedding: torch.Tensor | None, prev: torch.Tensor | None, own: torch.Tensor | None,
         tail: torch.Tensor | None, recorded: int, width: int, nxt: int, branches: int) -> tuple[torch.Tensor, ...]:
    """`torch.ops.specgen.beam` on CUDA: each row's best `nxt` of the W x W children recorded in a growth's record
    (scores, tokens, padding, parents [n, N], contiguous) from column `recorded`: their scores, parents (index // W)
    [n, nxt], each branch row's tokens [n * br, nxt] and its features hidden [n * br, W, D] at those parents
    [n * br, nxt, D], or given the drafter's `embedding` [V, D] its next input [n * br, nxt, 2 D], the tokens'
    embeddings and the features side by side (`embed_cat`'s bits); given the level's lists prev [n * br, W, T]
    (int32), the next level's own slots [n * br, nxt, 1] and tail [n * br, 1, T], its lists [n * br, nxt, T]
    (`LevelLists.level`'s bits; else an empty tensor); their slots, each `nxt` times, written as the next level's
    parents (triton_kernels.beam_rows)."""
    n, nodes = scores.shape
    assert recorded + width * width + nxt * nxt <= nodes, "the level's children and the next level's parents fit"
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    dim, join, listed = hidden.shape[-1], embedding is not None, prev is not None
    on = dict(dtype=torch.long, device=scores.device)
    score, parent = torch.empty(n, nxt, dtype=scores.dtype, device=scores.device), torch.empty(n, nxt, **on)
    tok = torch.empty(n * branches, nxt, **on)
    feats = torch.empty(n * branches, nxt, (1 + join) * dim, dtype=hidden.dtype, device=hidden.device)
    t = prev.shape[-1] if listed else 0
    lists = torch.empty(n * branches, nxt, t, dtype=torch.int32, device=scores.device) if listed else tok.new_empty(0)
    if n:
        prev, own, tail = ((prev.contiguous(), own.contiguous(), tail.contiguous().view(torch.uint8)) if listed else
                           (lists,) * 3)
        kernels().beam_rows[(n,)](scores, tokens, padding.view(torch.uint8), parents, hidden,
                                  embedding.contiguous() if join else hidden, prev, own, tail, score, parent, tok,
                                  feats, lists, nodes, recorded, hidden.stride(0), hidden.stride(1), t, W=width,
                                  NXT=nxt, BRANCHES=branches, BLOCK=max(16, pow2(width * width)), BLOCK_NXT=pow2(nxt),
                                  D=dim, BLOCK_D=min(pow2(dim), BEAM_FEATURES), JOIN=join, LISTED=listed,
                                  BLOCK_T=PLAN_BLOCK, num_warps=WARPS)
    return score, parent, tok, feats, lists


def kept_tree(scores: torch.Tensor, padding: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
              counts: torch.Tensor, roots: torch.Tensor, root_pos: torch.Tensor, total: int,
              levels: int) -> tuple[torch.Tensor, ...]:
    """`torch.ops.specgen.kept_tree` on CUDA, one launch (triton_kernels.kept_tree_rows): from every node's scores
    [n, N] float32, padding [n, N] bool, tokens and parent slots [n, N] int64 (-1: the root), each row's kept count,
    root token and root position [n] int64, the bits of eagle_grow's `in_slot_order(best_nodes(scores, padding, total),
    tokens, parents, counts)` -> tokens, parents [n, t] (t = min(total, N)) and `tree_inputs` of them over `levels` ->
    tokens, positions [n, t + 1] and mask [n, t + 1, t + 1] bool."""
    scores, tokens, parents = scores.contiguous(), tokens.contiguous(), parents.contiguous()
    n, nodes = scores.shape
    t = min(total, nodes)
    on = dict(dtype=torch.int64, device=scores.device)
    outs = (torch.empty(n, t, **on), torch.empty(n, t, **on), torch.empty(n, t + 1, **on),
            torch.empty(n, t + 1, **on), torch.empty(n, t + 1, t + 1, dtype=torch.bool, device=scores.device))
    if not n:  # no row: nothing to launch (a launch needs a program)
        return outs
    block = max(TREE_ROWS, pow2(t + 2))  # the kept lanes, a -1 and a lane above all: fixed while N >= the node budget
    hops = (1 << levels.bit_length()) - 1  # the ancestors `tree_inputs`' pointer-jumping rounds reach
    kernels().kept_tree_rows[(n,)](scores, padding.contiguous().view(torch.uint8), tokens, parents, counts.contiguous(),
                                   roots.contiguous(), root_pos.contiguous(), *outs[:4], outs[4].view(torch.uint8),
                                   nodes, t, hops, SB=block, CHUNK=max(TREE_CHUNK, block),
                                   ROWS=TREE_ROWS, num_warps=WARPS)
    return outs


def setup_shapes(n: int, rows: int, levels: int, nodes: int, width: int, t: int,
                 table: torch.Tensor) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """`growth_setup`'s outputs (shape, dtype) for n sequences of `rows` cache rows, `levels` levels of `width` nodes,
    a record of `nodes`, T = `t` slots and a RoPE table [P, 2, hd]: the record's padding and parents [n, N]; positions,
    meta; own slots, counts, tail, shared run, level 0's lists; each level's rows' table rows
    (eagle_grow.GrowthSetup)."""
    i64, i32, b = torch.int64, torch.int32, torch.bool
    return (((n, nodes), b), ((n, nodes), i64), ((levels, rows), i64), ((levels, 2, rows), i64),
            ((levels, rows, width), i32), ((levels, rows, width), i32), ((levels, rows, t), b), ((rows,), i32),
            ((rows, width, t), i32), ((levels * rows, 1, *table.shape[1:]), table.dtype))


def growth_setup(ints: torch.Tensor, writes: torch.Tensor, table: torch.Tensor, levels: int, nodes: int, width: int,
                 branches: int, t: int) -> tuple[torch.Tensor, ...]:
    """`torch.ops.specgen.growth_setup` on CUDA, one launch (triton_kernels.setup_rows): a captured growth's constants
    from its ints [6, n], each cache row's write row [n * br] and the drafter's RoPE table [P, 2, hd]
    (`setup_shapes`)."""
    n, rows = ints.shape[1], writes.shape[0]
    outs = tuple(torch.empty(shape, dtype=dtype, device=ints.device)
                 for shape, dtype in setup_shapes(n, rows, levels, nodes, width, t, table))
    args = (x.view(torch.uint8) if x.dtype == torch.bool else x for x in outs)
    row = table[0].numel()
    kernels().setup_rows[(levels, rows)](ints.contiguous(), writes.contiguous(), table.contiguous(), *args, n, nodes,
                                         t, W=width, BRANCHES=branches, BLOCK_W=pow2(width), BLOCK=PLAN_BLOCK,
                                         ROW=row, BLOCK_ROW=pow2(row))
    return outs


def embed_cat(weight: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """`torch.ops.specgen.embed_cat` on CUDA, one launch (triton_kernels.embed_rows): cat([weight[tokens],
    features], -1) for tokens [R, S] and features [R, S, D] (any strides but the last) -> [R, S, 2 D]."""
    r, s = tokens.shape
    dim = weight.shape[1]
    out = torch.empty(r, s, 2 * dim, dtype=weight.dtype, device=weight.device)
    feats = features if features.stride(-1) == 1 else features.contiguous()
    if r * s:
        kernels().embed_rows[(r * s,)](weight.contiguous(), tokens.contiguous(), feats, out, s, dim, feats.stride(0),
                                       feats.stride(1), BLOCK=max(16, pow2(dim)))
    return out


def commit_slots(k: torch.Tensor, v: torch.Tensor, moves: torch.Tensor) -> None:
    """`torch.ops.specgen.commit_slots` on CUDA, one launch (triton_kernels.commit_rows): each move (cache row, source
    slot, destination slot) of moves [3, N] int64 copies that row's key and value D-vectors of every layer and kv head
    of k, v [L, B, Hkv, T, D] (D contiguous) from the source slot to the destination, as `k[:, row, :, dst] = k[:,
    row, :, src]` does for moves from ascending keeps (KVCache.commit_seqs': a slot both a source and a destination
    is read before it is written)."""
    n_layers, _, heads, _, d = k.shape
    n = moves.shape[1]
    if not n:  # nothing moves (a launch needs work: its programs would only return)
        return
    kernels().commit_rows[(n_layers * heads,)](k, v, moves.contiguous(), n, heads, *k.stride()[:4], *v.stride()[:4],
                                               D=d, BLOCK=COMMIT_BLOCK, BLOCK_D=max(16, pow2(d)))
