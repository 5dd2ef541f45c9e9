"""The list attention's CUDA kernels: `torch.ops.specgen.attention_plan` and `attend` on CUDA (torch ops, Triton)."""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch

# The invariant (docs/precision.md, "The invariant attention"): a query's result depends only on its own list of
# visible slots (ascending: AR's key order, for tree nodes too) and their keys and values, never on the forward's
# width, its other queries or its batch. One program computes one (query, kv head) pair: its group of query heads as
# the rows of fixed-shape tiles, keys taken from its list in blocks of BLOCK_N from the list's start, with an online
# softmax in float32. The loop stops at the query's own count, so slots it cannot see are never read, and every
# constexpr (tile shapes, warps) is fixed per model, so a query runs the same instructions in every forward.
BLOCK_N = 64  # list entries (keys) per tile
WARPS = 4


@functools.cache
def available() -> bool:
    """Whether Triton can be imported here (it ships with torch's CUDA builds; checked without importing it); where
    not, one warning, and CUDA forwards take the torch paths of docs/precision.md's table."""
    if importlib.util.find_spec("triton") is None:
        warnings.warn("Triton is not installed: CUDA attention runs as torch ops (slower; float32 on SDPA, whose sums "
                      "move with the forward's shape), see docs/precision.md; `pip install triton` for the list kernel")
        return False
    return True


@functools.cache
def kernel():
    """The Triton kernel, made on first use (so `import specgen` never imports Triton; `TRITON_INTERPRET=1` before the
    first use runs it on CPU tensors, which is how the default suite tests it)."""
    import triton  # an optional dependency, imported where a CUDA forward first attends
    import triton.language as tl

    @triton.jit(do_not_specialize=["n_q", "sqb", "sqh", "sqs", "skb", "skh", "skt", "svb", "svh", "svt", "sib",
                                   "sis", "sob", "sos", "soh"])
    def attend_lists(Q, K, V, IDX, COUNT, OUT, n_q, scale, sqb, sqh, sqs, skb, skh, skt, svb, svh, svt, sib, sis,
                     sob, sos, soh, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
        # 1. this program's query (b, s), kv head, and its GROUP query heads as tile rows (padding rows: zeros)
        row = tl.program_id(0)  # b * n_q + s
        kvh = tl.program_id(1)
        b = row // n_q
        s = row - b * n_q
        heads = kvh * GROUP + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
        real_rows = tl.arange(0, BLOCK_M) < GROUP
        real_dims = dims < D
        q = tl.load(Q + b * sqb + s * sqs + heads[:, None] * sqh + dims[None, :],
                    mask=real_rows[:, None] & real_dims[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
        n = tl.load(COUNT + row)  # how many slots this query sees (>= 1: itself)
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # 2. its list in blocks from the start: scores, the running max, and the rescaled sums (online softmax)
        start = n * 0  # a while loop, not range(0, n): Triton's interpreter cannot take a loaded bound
        while start < n:
            pos = start + tl.arange(0, BLOCK)  # [BLOCK]
            seen = pos < n
            slot = tl.load(IDX + b * sib + s * sis + pos, mask=seen, other=0)
            keep = seen[:, None] & real_dims[None, :]
            k = tl.load(K + b * skb + kvh * skh + slot[:, None] * skt + dims[None, :], mask=keep,
                        other=0.0).to(tl.float32)  # [BLOCK, BLOCK_D]
            v = tl.load(V + b * svb + kvh * svh + slot[:, None] * svt + dims[None, :], mask=keep,
                        other=0.0).to(tl.float32)
            score = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK]
            score = tl.where(seen[None, :], score, float("-inf"))  # past the list: p = 0 exactly
            new_top = tl.maximum(top, tl.max(score, 1))
            keep_old = tl.exp(top - new_top)  # the first block: exp(-inf) = 0
            p = tl.exp(score - new_top[:, None])
            total = total * keep_old + tl.sum(p, 1)
            acc = acc * keep_old[:, None] + tl.dot(p, v, input_precision="ieee")
            top = new_top
            start += BLOCK
        # 3. divide (a query that sees nothing: 0, as attention.c), round once to the output's dtype, store
        out = acc / tl.maximum(total, 1.1754944e-38)[:, None]
        tl.store(OUT + b * sob + s * sos + heads[:, None] * soh + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=real_rows[:, None] & real_dims[None, :])

    return attend_lists


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, count: torch.Tensor,
           shared: torch.Tensor, out: torch.Tensor) -> None:
    """`torch.ops.specgen.attend` on CUDA: q [B, H, S, D] over k, v [B, Hkv, T, D] into out [B, S, H, D], each query
    over its list idx [B, S, T] (the first count [B, S] entries; `shared` is the CPU kernel's and unread here)."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    idx = idx if idx.stride(-1) == 1 else idx.contiguous()
    count = count.contiguous()
    b, h, s, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    kernel()[(b * s, hkv)](
        q, k, v, idx, count, out, s, d**-0.5, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), idx.stride(0), idx.stride(1), out.stride(0),
        out.stride(1), out.stride(2), **tiles(group, d), num_warps=WARPS)


def tiles(group: int, d: int) -> dict[str, int]:
    """The kernel's constexprs for `group` query heads per kv head of width `d`: powers of two, the rows just the
    group (the products are float32 FMA dots, which take any row count: 16 rows for SmolLM2's 3 heads would be 5x the
    work), the width at least 16; fixed per model, so every forward of it runs one compiled kernel."""
    pow2 = lambda n: 1 << (n - 1).bit_length()  # noqa: E731
    return dict(GROUP=group, D=d, BLOCK_M=pow2(group), BLOCK_D=max(16, pow2(d)), BLOCK=BLOCK_N)


def attention_plan(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.ops.specgen.attention_plan` in device ops (no host read, so a captured step builds it in its graph): the
    same idx [B, S, T], count [B, S] and shared [B] (int32) as attention.c's plan of the bool mask seen [B, S, T]."""
    idx = torch.sort((~seen).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)  # visible first, ascending
    count = seen.sum(-1, dtype=torch.int32)
    shared = seen.all(1).to(torch.int32).cumprod(-1).sum(-1, dtype=torch.int32)  # [B]: slots 0.. every query sees
    return idx, count, shared
