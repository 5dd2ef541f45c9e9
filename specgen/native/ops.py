"""The native kernels as torch ops (`torch.ops.specgen.*`): the one place that calls the C libraries."""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from specgen import native
from specgen.native import cuda_ops

# CPU tensors, and CUDA ones through cuda_ops.py's Triton kernels (some CUDA only: torch's ops run elsewhere); no
# backward; `models/kernel_choice.py` decides when they run. The C side reads raw elements: each op makes its inputs
# contiguous (attention: the last dim) before passing pointers.


def lib(name: str) -> ctypes.CDLL:
    got = native.library(name)
    if got is None:
        raise RuntimeError(f"specgen's native {name} kernels are not built here (models/kernel_choice.py checks first)")
    return got


def check(status: int, what: str) -> None:
    if status != 0:
        raise MemoryError(f"native {what} failed (status {status}): no scratch memory")


LIB = torch.library.Library("specgen", "DEF")  # noqa: TOR901 -- plain dispatcher ops: custom_op's Python wrapper
# costs more per call than a decode step's small kernels themselves (docs/LOG.md, session 34)


def op(schema: str, fake, device: str = "CPU"):
    """Defines torch.ops.specgen.<name> by `schema`, the decorated function as its `device` kernel and `fake` as its
    meta/fake kernel (shapes for the profiler, FakeTensorMode and torch.compile); returns the op."""
    name = schema.split("(", 1)[0]

    def register(kernel):
        LIB.define(schema)
        LIB.impl(name, kernel, device)
        torch.library.register_fake(f"specgen::{name}", fake, lib=LIB)
        return getattr(torch.ops.specgen, name)
    return register


@functools.cache
def c_strides(strides: tuple[int, ...]):
    """A tensor's first three strides as a C int64[3] (one per layout: layers of a forward share theirs)."""
    return (ctypes.c_int64 * 3)(*strides[:3])


def traced(x: torch.Tensor) -> bool:
    """Whether a product must go through torch.ops: x is a tensor subclass (fake, functional) or a dispatch mode is on
    (FakeTensorMode, make_fx, an op counter), which reach its fake kernel or see the op. Otherwise the products
    (`tiled_linear`, `qmm`) call their C kernel as functions: the dispatcher's round trip into Python costs ~1.5 us,
    5% of an int4 SmolLM2 decode step (docs/LOG.md, session 49)."""
    return type(x) is not torch.Tensor or torch._C._len_torch_dispatch_stack() > 0


def like(x: torch.Tensor, *_) -> torch.Tensor:
    """A fake kernel's output: a new contiguous tensor shaped as the first input."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm_float32(x) rounded to x's dtype, over the last dim, as transformer.RMSNorm: [..., dim]. CPU
    tensors; called as a function (as the products: `traced`), through torch.ops where traced."""
    if traced(x):
        return torch.ops.specgen.rms_norm(x, weight, eps)
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    check(lib("glue").specgen_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps,
                                       x.element_size()), "rms_norm")
    return out


op("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", like)(rms_norm)
LIB.impl("rms_norm", cuda_ops.rms_norm, "CUDA")  # Triton, one program a row (cuda_ops.py)


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + a, RMSNorm(x + a)): a residual add and the pre-norm after it, in one pass ([..., dim] each); CPU tensors,
    called as `rms_norm`."""
    if traced(x):
        return torch.ops.specgen.add_rms_norm(x, a, weight, eps)
    x, a = x.contiguous(), a.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    dim = x.shape[-1]
    check(lib("glue").specgen_add_rms_norm(x.data_ptr(), a.data_ptr(), weight.data_ptr(), total.data_ptr(),
                                           out.data_ptr(), x.numel() // dim, dim, eps, x.element_size()), "norm")
    return total, out


op("add_rms_norm(Tensor x, Tensor a, Tensor weight, float eps) -> (Tensor, Tensor)",
   lambda x, *_: (like(x), like(x)))(add_rms_norm)
LIB.impl("add_rms_norm", cuda_ops.add_rms_norm, "CUDA")


# CUDA only (torch's ops elsewhere), one Triton pass each: rope.rotate's roll, two products and sum; RoPE and a
# captured step's cache writes (StaticCache); SwiGLU's gate silu(a) * b
op("rope(Tensor x, Tensor cos, Tensor sin, bool half) -> Tensor", like, "CUDA")(cuda_ops.rope)
op("rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k, Tensor(b!) v, Tensor meta, int heads, bool half) -> "
   "Tensor", lambda qkv, cos, sin, k, v, meta, heads, half: qkv.new_empty(qkv.shape[0], heads, *qkv.shape[2:]),
   "CUDA")(cuda_ops.rope_store)
op("silu_mul(Tensor a, Tensor b) -> Tensor", like, "CUDA")(cuda_ops.silu_mul)
# an EAGLE drafter's input, cat([embedding, features]), in one pass (a copy: the same bits)
op("embed_cat(Tensor weight, Tensor tokens, Tensor features) -> Tensor",
   lambda weight, tokens, features: features.new_empty(*tokens.shape, 2 * weight.shape[1]), "CUDA")(cuda_ops.embed_cat)


def beam_shapes(scores, tokens, padding, parents, hidden, embedding, prev, own, tail, recorded, width, nxt, branches
                ) -> tuple[torch.Tensor, ...]:
    """`beam`'s outputs' shapes (cuda_ops.beam)."""
    n, rows = scores.shape[0], scores.shape[0] * branches
    return (scores.new_empty(n, nxt), tokens.new_empty(n, nxt), tokens.new_empty(rows, nxt),
            hidden.new_empty(rows, nxt, (1 + (embedding is not None)) * hidden.shape[-1]),
            tokens.new_empty(0) if prev is None else prev.new_empty(rows, nxt, prev.shape[-1]))


# CFG's combine of logits pairs (image/target.guided), its three elementwise ops in one pass (their bits)
op("guided(Tensor logits, float scale) -> Tensor",
   lambda logits, scale: logits.new_empty(logits.shape[0] // 2, *logits.shape[1:]), "CUDA")(cuda_ops.guided)
# a tree growth's rankings (methods/eagle_grow.py), one pass each, written into its record (eagle_grow.Frame): a
# drafter level's children from its head's logits (CFG, log-softmax, top-k and path scores), and its beam (the best
# children over a row's frontier, the next level's parents, and the next level's inputs and attention lists)
op("top_children(Tensor logits, Tensor? scores, int branches, float scale, int k, Tensor(a!) values, "
   "Tensor(b!) index, int at) -> ()", lambda *args: None, "CUDA")(cuda_ops.top_children)
op("beam(Tensor scores, Tensor tokens, Tensor padding, Tensor(a!) parents, Tensor hidden, Tensor? embedding, "
   "Tensor? prev, Tensor? own, Tensor? tail, int recorded, int width, int nxt, int branches) -> "
   "(Tensor, Tensor, Tensor, Tensor, Tensor)", beam_shapes, "CUDA")(cuda_ops.beam)


def kept_tree_shapes(scores, padding, tokens, parents, counts, roots, root_pos, total, levels
                     ) -> tuple[torch.Tensor, ...]:
    """`kept_tree`'s outputs for scores [n, N] and the node budget `total`, t = min(total, N): tokens, parents [n, t],
    the verify's tokens, positions [n, t + 1] (int64) and mask [n, t + 1, t + 1] (bool)."""
    n, t = scores.shape[0], torch.sym_min(total, scores.shape[1])
    on = dict(dtype=torch.int64)
    return (scores.new_empty(n, t, **on), scores.new_empty(n, t, **on), scores.new_empty(n, t + 1, **on),
            scores.new_empty(n, t + 1, **on), scores.new_empty(n, t + 1, t + 1, dtype=torch.bool))


# CUDA only (eagle_grow.py's torch functions elsewhere), one Triton program a row: a tree growth's tail, its kept
# nodes in slot order and its verify's inputs (`best_nodes`, `in_slot_order`, `tree_inputs`)
op("kept_tree(Tensor scores, Tensor padding, Tensor tokens, Tensor parents, Tensor counts, Tensor roots, "
   "Tensor root_pos, int total, int levels) -> (Tensor, Tensor, Tensor, Tensor, Tensor)", kept_tree_shapes,
   "CUDA")(cuda_ops.kept_tree)


# CUDA only (eagle_grow.GrowthSetup's torch ops elsewhere), one Triton program a level and cache row: a captured
# growth's constants from the host-known ints
op("growth_setup(Tensor ints, Tensor writes, Tensor table, int levels, int nodes, int width, int branches, int t) -> "
   "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
   lambda ints, writes, table, levels, nodes, width, branches, t: tuple(
       ints.new_empty(shape, dtype=dtype)
       for shape, dtype in cuda_ops.setup_shapes(ints.shape[1], writes.shape[0], levels, nodes, width, t, table)),
   "CUDA")(cuda_ops.growth_setup)


def tiled_linear(x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                 threads: int) -> torch.Tensor:
    """float32 x [..., K] @ W^T + b -> [..., N] over `tile(W, b)`, on `threads` threads (torch's count: OpenMP's
    own default on a thread torch never set up is every core); each output row is a fixed function of its input row
    (tiled.c: the same sums at every row count)."""
    if traced(x):
        return torch.ops.specgen.tiled_linear(x, tiles, bias, out_features, threads)
    k = tiles.shape[1]
    rows = x.reshape(-1, k).contiguous()  # [M, K]
    out = x.new_empty(*x.shape[:-1], out_features)
    lib("tiled").specgen_tiled_linear(rows.data_ptr(), tiles.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                      out.data_ptr(), rows.shape[0], k, out_features, threads)
    return out


op("tiled_linear(Tensor x, Tensor tiles, Tensor? bias, int out_features, int threads) -> Tensor",
   lambda x, tiles, bias, out_features, threads: x.new_empty(*x.shape[:-1], out_features))(tiled_linear)


@op("attention_plan(Tensor seen) -> (Tensor, Tensor, Tensor)",
    lambda seen: tuple(seen.new_empty(seen.shape[:n], dtype=torch.int32) for n in (3, 2, 1)))
def attention_plan(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(idx [B, S, T], count [B, S], shared [B], int32) of a bool mask seen [B, S, T]: each query's visible slots
    ascending then its hidden ones, how many it sees, and the leading slots 0, 1, ... every query of a row sees."""
    b, s, t = seen.shape
    seen = seen.contiguous()
    idx, count, shared = (seen.new_empty(seen.shape[:n], dtype=torch.int32) for n in (3, 2, 1))
    lib("attention").specgen_plan(seen.data_ptr(), b, s, t, idx.data_ptr(), count.data_ptr(), shared.data_ptr())
    return idx, count, shared


LIB.impl("attention_plan", cuda_ops.attention_plan, "CUDA")  # the same lists in device ops
# CUDA only (static_step.visibility's mask, then attention_plan, elsewhere): a step's plan from its tree rows and
# lengths
op("step_plan(Tensor lengths, Tensor tree, int t) -> (Tensor, Tensor, Tensor)",
   lambda lengths, tree, t: tuple(tree.new_empty(shape, dtype=torch.int32) for shape in (
       (*tree.shape[:2], t), tree.shape[:2], tree.shape[:1])), "CUDA")(cuda_ops.step_plan)


def one_dtype(*tensors: torch.Tensor) -> None:
    if any(t.dtype != tensors[0].dtype for t in tensors):  # the kernel reads raw elements of one dtype
        raise TypeError(f"native attention takes one dtype, got {', '.join(str(t.dtype) for t in tensors)}")


@op("attend(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor count, Tensor shared, Tensor(a!) out, "
    "float softcap=0.0) -> ()", lambda *args: None)  # writes `out` only
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, count: torch.Tensor,
           shared: torch.Tensor, out: torch.Tensor, softcap: float = 0.0) -> None:
    """Width-invariant attention of q [B, H, S, D] over k, v [B, Hkv, T, D] into out [B, S, H, D] (contiguous), each
    query over its `attention_plan` list; one dtype (bfloat16 or float32) throughout. attention.c has no score cap
    (`softcap`: CUDA's kernel only; a CPU plans a capped model's attention chunked, `attention_path`)."""
    if softcap:
        raise ValueError("attention.c has no score softcap: a capped model attends chunked on a CPU (attention_path)")
    one_dtype(q, k, v, out)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    b, h, s, d = q.shape
    check(lib("attention").specgen_attend(
        q.data_ptr(), c_strides(q.stride()), k.data_ptr(), c_strides(k.stride()), v.data_ptr(), c_strides(v.stride()),
        idx.data_ptr(), count.data_ptr(), shared.data_ptr(), out.data_ptr(), q.element_size(), b, h, k.shape[1], s, d,
        k.shape[2], d**-0.5), "attention")


LIB.impl("attend", cuda_ops.attend, "CUDA")  # Triton: each query over its list, in a fixed order (cuda_ops.py)


def rope_write_attend(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool, kc: torch.Tensor,
                      vc: torch.Tensor, slots: torch.Tensor, qbuf: torch.Tensor, idx: torch.Tensor,
                      count: torch.Tensor, shared: torch.Tensor, out: torch.Tensor) -> None:
    """A self-attention layer between its products: qkv [B, S, (H + 2 Hkv) D] has q and k rotated (cos, sin [B, 1, S,
    D]; `half` layout or interleaved), k and v written to the cache layer kc, vc [B, Hkv, T_max, D] at `slots` [B, S],
    and the queries (staged in qbuf [B, H, S, D]) attend as `attend` into out: bitwise rotate, KVCache.write, attend.
    Called as `rms_norm`."""
    if traced(qkv):
        return torch.ops.specgen.rope_write_attend(qkv, cos, sin, half, kc, vc, slots, qbuf, idx, count, shared, out)
    one_dtype(qkv, cos, sin, kc, vc, qbuf, out)
    b, s, h, d = out.shape
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    check(lib("attention").specgen_rope_write_attend(
        qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), int(half), kc.data_ptr(), c_strides(kc.stride()),
        vc.data_ptr(), c_strides(vc.stride()), slots.data_ptr(), qbuf.data_ptr(), idx.data_ptr(), count.data_ptr(),
        shared.data_ptr(), out.data_ptr(), qkv.element_size(), b, h, kc.shape[1], s, d, idx.shape[-1], d**-0.5),
          "attention")


op("rope_write_attend(Tensor qkv, Tensor cos, Tensor sin, bool half, Tensor(a!) kc, Tensor(b!) vc, Tensor slots, "
   "Tensor(c!) qbuf, Tensor idx, Tensor count, Tensor shared, Tensor(d!) out) -> ()",
   lambda *args: None)(rope_write_attend)  # writes its mutated arguments only


def tile(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tiles [ceil(N / T)][K][T], bias padded to ceil(N / T) * T or None) of a float32 weight [N, K], any strides:
    `tiled_linear`'s layout, T = tiled.c's tile width. Zeros past N: the padded columns are computed, never written."""
    tiles = fill_tiles(empty_tiles(*weight.shape, weight.dtype, weight.device), weight)
    return tiles, padded_bias(bias, tiles)


def empty_tiles(n: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Tiles [ceil(N / T), K, T] for a weight [N, K], the columns past N zero, the rest unset."""
    width = lib("tiled").specgen_tiled_width()
    tiles = torch.empty(-(-n // width), k, width, dtype=dtype, device=device)
    tiles[-1, :, n - (tiles.shape[0] - 1) * width:] = 0
    return tiles


@torch.no_grad()
def fill_tiles(tiles: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Write weight [N, K] (any strides) into `tiles` (`empty_tiles`' layout) with no intermediate copy; returns it."""
    n, k = weight.shape
    width = tiles.shape[2]
    full = n // width * width
    tiles[: n // width].copy_(weight[:full].reshape(-1, width, k).transpose(1, 2))  # whole tiles: [N // T, K, T]
    if full < n:
        tiles[-1, :, : n - full].copy_(weight[full:].t())  # the last, partial tile
    return tiles


def padded_bias(bias: torch.Tensor | None, tiles: torch.Tensor) -> torch.Tensor | None:
    """`bias` [N] zero-padded to the columns of `tiles` [N_pad / T, K, T] (None stays None)."""
    return None if bias is None else F.pad(bias.detach(), (0, tiles.shape[0] * tiles.shape[2] - bias.shape[0]))


#: outputs per tile and inputs per activation block of qmm.c's layout; QMM_LAYOUT: its version (stored copies key on it)
QMM_TILE, QMM_BLOCK, QMM_LAYOUT = 16, 32, 1


def qmm(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor, bits: int, group: int, out_features: int,
        threads: int) -> torch.Tensor:
    """x [..., K] (bfloat16 or float32) @ w^T -> [..., N] in x's dtype over `pack_codes`' (codes, sz), with x
    quantized to 15 bits (two int8 bytes) per row and block of 32 (qmm.c: each output row a function of its input
    row alone)."""
    if traced(x):
        return torch.ops.specgen.qmm(x, codes, sz, bits, group, out_features, threads)
    k = x.shape[-1]
    rows = x.reshape(-1, k).contiguous()  # [M, K]
    out = x.new_empty(*x.shape[:-1], out_features)
    check(lib("qmm").specgen_qmm(rows.data_ptr(), rows.element_size(), codes.data_ptr(), sz.data_ptr(), bits, group,
                                 out.data_ptr(), rows.shape[0], k, out_features, threads), "qmm")
    return out


op("qmm(Tensor x, Tensor codes, Tensor sz, int bits, int group, int out_features, int threads) -> Tensor",
   lambda x, codes, sz, bits, group, out_features, threads: x.new_empty(*x.shape[:-1], out_features))(qmm)


def packed_shapes(n: int, k: int, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_codes`' outputs for N outputs of K inputs as empty meta tensors (int4: `groups` scale groups; 0: int8)."""
    tiles, nb = -(-n // QMM_TILE), k // QMM_BLOCK
    codes = torch.empty(tiles, nb * (256 if groups else 512), dtype=torch.uint8, device="meta")
    return codes, torch.empty(tiles, groups or 1, 2 if groups else 1, QMM_TILE, dtype=torch.bfloat16, device="meta")


def pack_codes(codes: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [tiles, K / 32 * (256 | 512)] uint8, sz [tiles, groups, 2 | 1, 16] bfloat16): qmm.c's layout of int4
    codes [N, K] (uint8 0..15) with scales, zeros [N, groups], or of int8 codes [N, K] with scales [N] (zeros None);
    outputs past N get zero codes and scales."""
    n, k = codes.shape
    tiles, nb = -(-n // QMM_TILE), k // QMM_BLOCK
    pad = tiles * QMM_TILE - n
    c = torch.cat([codes, codes.new_zeros(pad, k)]) if pad else codes
    if zeros is None:  # int8: chunk p holds inputs 4p .. 4p + 3 of each output lane
        packed = c.view(tiles, QMM_TILE, nb, 8, 4).permute(0, 2, 3, 1, 4).contiguous().view(torch.uint8)
        sz = scales.to(torch.bfloat16).reshape(n, 1, 1)
    else:  # int4: chunk h holds inputs 8h + i (low nibble) and 8h + 4 + i (high nibble)
        v = c.view(tiles, QMM_TILE, nb, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [tiles, nb, h, lane, i, lo/hi]
        packed = (v[..., 0] | (v[..., 1] << 4)).contiguous()
        sz = torch.stack([scales, zeros], -1).to(torch.bfloat16)  # [N, groups, 2]
    sz = torch.cat([sz, sz.new_zeros(pad, *sz.shape[1:])]) if pad else sz
    sz = sz.view(tiles, QMM_TILE, *sz.shape[1:]).permute(0, 2, 3, 1).contiguous()  # [tiles, groups, 2 | 1, 16]
    return packed.reshape(tiles, -1), sz


# CUDA only (KVCache.commit_seqs' torch indexing elsewhere): a commit's moved slots, the keys and values of every
# layer, in one Triton launch (the torch path: a gather and a scatter for each of k and v)
op("commit_slots(Tensor(a!) k, Tensor(b!) v, Tensor moves) -> ()", lambda *args: None, "CUDA")(cuda_ops.commit_slots)
