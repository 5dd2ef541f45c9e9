"""Attention invariant to batch and width: a query's result depends only on it and its keys (docs/precision.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specgen.models.elementwise import row_invariant
from specgen.models.kernel_choice import attention_path
from specgen.native import ops

CHUNK = 128  # key slots per chunk
MIN_ROWS = 4  # GEMM rows below which MKL's float32 products take another code path


@dataclass
class AttentionPlan:
    """What every layer of one forward shares: the additive mask and float32 staging buffers (zero-padded past
    the real keys and query rows; each layer overwrites only the real part, so the padding stays finite), with the
    views each layer reads made once here (a layer's attention is ~20 small ops; a view made per layer is one more)."""

    bias: torch.Tensor  # [B, 1, N, R, CHUNK] 0 visible / -inf hidden; R = max(G*S, MIN_ROWS), rows ordered (g, s)
    q: torch.Tensor  # [B, Hkv, N, R, D]: the query rows once per key chunk (one GEMM per chunk, scores in chunk layout)
    k: torch.Tensor  # [B, Hkv, N*CHUNK, D]
    v: torch.Tensor  # [B, Hkv, N*CHUNK, D + 1]: the values and a column of ones (the softmax sums, by the same GEMM)
    rows: int  # G*S
    order: torch.Tensor | None = None  # [B, S, T] trees: the slot each AR-layout column reads (`plan`; else None)
    tree_bias: torch.Tensor | None = None  # [B, 1, S, N, RG, CHUNK] the compacted visibility, RG = max(G, MIN_ROWS)
    shared_chunks: int = 0  # trees: leading chunks in AR's layout for every query (the committed prefix)
    score_cols: torch.Tensor | None = None  # [B, S, N*CHUNK] trees: cache slot of each AR-layout column (pad: 0)
    value_rows: torch.Tensor | None = None  # [B*S*(T - lo)] trees: flat (batch, slot) rows of the values past lo
    out: torch.Tensor | None = None  # [B, S, H, D] in the queries' dtype: every layer's result (made by the first)
    softcap: float = 0.0  # > 0: each scaled score s becomes softcap tanh(s / softcap) before the mask (`masked_scores`)

    def __post_init__(self) -> None:
        b, hkv, n, r, d = self.q.shape
        self.q_real = self.q[:, :, :, : self.rows]  # [B, Hkv, N, G*S, D]: written by each layer
        self.q3 = self.q.view(b * hkv * n, r, d)
        self.kt3 = self.k.view(b * hkv * n, CHUNK, d).transpose(1, 2)  # [B*Hkv*N, D, CHUNK]
        self.v3 = self.v.view(b * hkv * n, CHUNK, d + 1)  # [B*Hkv*N, CHUNK, D + 1]
        self.v_real = self.v[..., :d]  # [B, Hkv, N*CHUNK, D]: written by each layer


@dataclass
class NativePlan:
    """A forward's plan for the native kernel: each query's visible slots as an ascending list, and the output."""

    idx: torch.Tensor  # [B, S, T] int32: query (b, s)'s visible slots first, ascending (the rest: unread)
    count: torch.Tensor  # [B, S] int32: how many slots query (b, s) sees
    shared: torch.Tensor  # [B] int32: the leading list entries 0, 1, ... every query of row b has (read once for all)
    out: torch.Tensor  # [B, S, H, D] in the activation dtype: every layer's result (the output projection's layout)
    slots: torch.Tensor | None = None  # [B, S] int32: the cache slot of each new token (lengths[b] + s)
    qbuf: torch.Tensor | None = None  # [B, H, S, D]: the rotated queries (native_self_attention)
    softcap: float = 0.0  # > 0: the scores' cap (CUDA's list kernel; a CPU never plans one: `attention_path`)


def native_plan(mask: torch.Tensor | None, b: int, s: int, t: int, heads: int, head_dim: int,
                lengths: list[int] | None = None, dtype: torch.dtype = torch.bfloat16,
                device: torch.device | str = "cpu", softcap: float = 0.0) -> NativePlan:
    """The list kernel's plan of a forward of S queries over T key slots (attention.c on a CPU, its Triton twin on
    CUDA: native/cuda_ops.py); on a CPU, given the cache's `lengths`, also where the forward's new keys go
    (native_self_attention writes them; CUDA has no fused kernel)."""
    on = dict(dtype=torch.int32, device=device)
    if mask is None:
        idx = torch.arange(t, **on).expand(b, s, t).contiguous()
        count = torch.full((b, s), t, **on)
        shared = torch.full((b,), t, **on)
    else:  # visible slots ascending, then hidden ones; the leading run all rows see
        idx, count, shared = torch.ops.specgen.attention_plan(mask[:, 0].expand(b, s, t))
    p = NativePlan(idx, count, shared, torch.empty(b, s, heads, head_dim, dtype=dtype, device=device), softcap=softcap)
    if lengths is not None and torch.device(device).type == "cpu":
        p.slots = (torch.tensor(lengths, dtype=torch.int32)[:, None] + torch.arange(s, dtype=torch.int32)).contiguous()
        p.qbuf = torch.empty(b, heads, s, head_dim, dtype=dtype)
    return p


def native_self_attention(
    qkv: torch.Tensor,  # [B, S, (H + 2 Hkv) * D]: the fused projection's output (bfloat16 or float32)
    rot,  # rope.Rotation: cos, sin [B, 1, S, D] in qkv's dtype
    kc: torch.Tensor,  # [B, Hkv, T_max, D] the cache layer's keys (written at p.slots)
    vc: torch.Tensor,  # [B, Hkv, T_max, D] and values
    p: NativePlan,
) -> torch.Tensor:
    """RoPE, the cache write and attention in one native call (bitwise what rotate, KVCache.write and
    invariant_attention compute); returns [B, S, H * D], a view of `p.out`."""
    b, s, h, d = p.out.shape
    ops.rope_write_attend(qkv, rot.cos, rot.sin, rot.layout == "half", kc, vc, p.slots, p.qbuf, p.idx, p.count,
                          p.shared, p.out)
    return p.out.view(b, s, h * d)


PLANS = (AttentionPlan, NativePlan)  # what `plan` returns; a layer given one attends with `invariant_attention`


def plan(
    mask: torch.Tensor | None,  # [B, 1, S, T] bool (True = visible), None = every slot visible
    b: int, s: int, t: int, heads: int, kv_heads: int, head_dim: int, device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32, lengths: list[int] | None = None, start: torch.Tensor | None = None,
    softcap: float = 0.0,
) -> AttentionPlan | NativePlan:
    """The plan of a forward of S queries over T key slots (made once, used by every layer): the native kernel's where
    `attention_path` names it (given the cache `lengths`, its layers may use native_self_attention), else chunked.
    `start` [B, S] (a sliding window's): each query's first visible position, where AR's cache holds its first key
    (else 0). A query's visible keys are one a position, ascending: AR's layout holds them at columns [start, start +
    count), and a tree's query gets that layout (the list kernel reads lists, not layouts: it needs no `start`).
    `softcap` > 0: the scores are capped (Gemma 2), alike on every path (`masked_scores`, the list kernel's CAP)."""
    if attention_path(dtype, device, softcap) == "native":
        return native_plan(mask, b, s, t, heads, head_dim, lengths, dtype, device, softcap)
    out = chain_plan(mask, b, s, t, heads, kv_heads, head_dim, device, softcap)
    n, group = -(-t // CHUNK), heads // kv_heads
    if mask is None:
        return out
    seen = mask[:, 0]  # [B, S, T]
    count = seen.sum(-1, keepdim=True)  # [B, S, 1]
    col = torch.arange(t, device=seen.device)  # [T]
    lead = 0 if start is None else start[:, :, None].to(seen.device)  # [B, S, 1]
    compact = (col >= lead) & (col < lead + count)  # [B, S, T]: visible columns [start, start + count) as in AR
    if not torch.equal(seen, compact):  # a tree: some query's keys are not the slots AR would give them
        order = torch.sort((~seen).to(torch.int8), dim=-1, stable=True).indices  # [B, S, T]: visible slots first
        # column c holds list entry c - start (mod T): the visible slots at [start, start + count), hidden ones around
        out.order = order if start is None else order.gather(2, (col - lead) % t)
        moved = (out.order != col) | ~compact  # [B, S, T]
        first = int(torch.where(moved.any(-1), moved.float().argmax(-1), t).min())  # [B, S] -> the earliest
        out.shared_chunks = first // CHUNK  # leading chunks every query sees exactly where the cache has them
        out.score_cols = F.pad(out.order, (0, n * CHUNK - t))  # padding columns: slot 0, hidden by the bias (-inf)
        lo = out.shared_chunks * CHUNK
        out.value_rows = (out.order[:, :, lo:] + torch.arange(b, device=seen.device)[:, None, None] * t).reshape(-1)
        rg = max(group, MIN_ROWS)
        tvis = F.pad(compact, (0, n * CHUNK - t), value=False).view(b, 1, s, n, 1, CHUNK)
        tvis = tvis.expand(b, 1, s, n, group, CHUNK)
        tvis = F.pad(tvis, (0, 0, 0, rg - group), value=True)  # padding rows: finite, then dropped
        out.tree_bias = torch.zeros(tvis.shape, dtype=torch.float32, device=device).masked_fill_(~tvis, float("-inf"))
    return out


def key_positions(lengths: torch.Tensor, positions: torch.Tensor, t: int) -> torch.Tensor:
    """[B, T] the token position of each of T cache slots: a committed slot's is its number (a text cache holds
    position i at slot i), a pending slot's its node's (positions [B, S] of the S nodes at lengths [B] + j); slots
    past a row's nodes get its last node's (hidden from every query anyway). Device ops only (captured steps)."""
    s = positions.shape[1]
    slot = torch.arange(t, device=positions.device)[None, :]  # [1, T]
    rel = slot - lengths[:, None]  # [B, T]
    return torch.where(rel < 0, slot, positions.gather(1, rel.clamp(0, s - 1)))


def in_window(queries: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """[B, 1, S, T] bool: which keys at positions `keys` [B, T] lie in the sliding window of queries at `queries`
    [B, S] (positions q - window + 1 .. q; later keys are the causal or tree mask's to hide: transformers'
    sliding_window_overlay, kv > q - window)."""
    return (keys[:, None, :] > queries[:, :, None] - window).unsqueeze(1)


def chain_plan(
    mask: torch.Tensor | None,  # [B, 1, S, T] bool (True = visible), None = every slot visible
    b: int, s: int, t: int, heads: int, kv_heads: int, head_dim: int, device: torch.device | str = "cpu",
    softcap: float = 0.0,
) -> AttentionPlan:
    """The chunked plan with every key in its cache slot (exact for queries whose keys sit where AR puts them: AR
    steps and chains). Device ops only, no host read: a captured forward (models/graphs.py) builds it in its graph."""
    n, group = -(-t // CHUNK), heads // kv_heads
    rows = group * s
    if mask is None:
        mask = torch.ones(b, 1, s, t, dtype=torch.bool, device=device)
    vis = F.pad(mask, (0, n * CHUNK - t), value=False)  # [B, 1, S, N*C]
    vis = vis.unsqueeze(2).expand(-1, 1, group, s, n * CHUNK).reshape(-1, 1, rows, n * CHUNK)  # rows (g, s)
    vis = F.pad(vis, (0, 0, 0, max(0, MIN_ROWS - rows)), value=True)  # padding rows: finite, then dropped
    r = vis.shape[2]
    vis = vis.view(-1, 1, r, n, CHUNK).transpose(2, 3)  # [B, 1, N, R, C]: the scores' chunk layout
    f32 = dict(dtype=torch.float32, device=device)
    bias = torch.zeros(vis.shape, **f32).masked_fill_(~vis, float("-inf"))
    v = torch.zeros(b, kv_heads, n * CHUNK, head_dim + 1, **f32)
    v[..., head_dim].fill_(1)  # a device fill (an assignment of a Python 1 would trace as a host tensor)
    return AttentionPlan(bias, torch.zeros(b, kv_heads, n, r, head_dim, **f32),
                         torch.zeros(b, kv_heads, n * CHUNK, head_dim, **f32), v, rows, softcap=softcap)


def masked_scores(qk: torch.Tensor, bias: torch.Tensor, d: int, softcap: float) -> torch.Tensor:
    """The chunked paths' scores from float32 products qk (a fresh tensor, overwritten with a cap) and the additive
    mask `bias` (broadcast to qk): bias + s for s = qk / sqrt(d), or with a cap (Gemma 2) bias + cap tanh(s / cap) in
    transformers' order of ops. One function for AR steps and trees: a score's bits depend on its product only."""
    if not softcap:
        return torch.add(bias, qk, alpha=d**-0.5)
    return row_invariant(torch.tanh_, qk.mul_(d**-0.5).div_(softcap)).mul_(softcap).add_(bias)


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                     softcap: float) -> torch.Tensor:
    """SDPA's attention [B, H, S, D] with softcapped scores (which SDPA lacks): q [B, H, S, D] over k, v [B, Hkv, T, D]
    (GQA when Hkv < H) under `mask` [B or 1, 1, S, T] (bool, True = visible, or additive float), else causal (the S
    queries last of the T keys) or none; float32 math, returned in q's dtype. Out-of-place ops: training takes its
    gradient. A query that sees nothing gets 0 (as the kernels)."""
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    g = h // hkv
    qk = torch.matmul(q.float().reshape(b, hkv, g * s, d), k.float().transpose(-1, -2)).view(b, hkv, g, s, t)
    scores = torch.tanh(qk * d**-0.5 / softcap) * softcap  # [B, Hkv, G, S, T]
    if mask is None and causal:
        mask = torch.ones(1, 1, s, t, dtype=torch.bool, device=q.device).tril(t - s)
    if mask is not None:
        m = mask.unsqueeze(2)  # [B, 1, 1, S, T]: over each kv head's G query heads
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    top = scores.amax(-1, keepdim=True).clamp(min=-1e30)  # a row that sees nothing: exp(-inf) = 0 everywhere
    w = torch.exp(scores - top)
    y = torch.matmul((w / w.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)).view(b, hkv, g * s, t),
                     v.float())  # [B, Hkv, G*S, D]
    return y.view(b, h, s, d).to(q.dtype)


def invariant_attention(
    q: torch.Tensor,  # [B, H, S, D]
    k: torch.Tensor,  # [B, Hkv, T, D] (slots 0 .. T-1 of the cache)
    v: torch.Tensor,  # [B, Hkv, T, D]
    p: AttentionPlan | NativePlan,
) -> torch.Tensor:
    """Softmax attention [B, H, S, D] in float32 (returned in q's dtype), GQA when Hkv < H, in the fixed chunk order
    (docs/precision.md); a [B, H, S, D] view of `p.out`, valid until the next layer's attention."""
    if isinstance(p, NativePlan):  # the native kernel
        torch.ops.specgen.attend(q, k, v, p.idx, p.count, p.shared, p.out, p.softcap)
        return p.out.transpose(1, 2)
    if p.order is not None:
        return tree_attention(q, k, v, p)
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    n, r, rows, g = p.q.shape[2], p.q.shape[3], p.rows, h // hkv
    # 1. stage q (rows ordered (g, s), once per chunk), k and v in float32; padding rows and slots stay 0
    p.q_real.copy_(q.reshape(b, hkv, 1, rows, d))
    p.k.narrow(2, 0, t).copy_(k)
    p.v_real.narrow(2, 0, t).copy_(v)
    # 2. scaled, masked scores in chunk layout; the row max over every chunk (exact: a max)
    scores = masked_scores(torch.bmm(p.q3, p.kt3).view(b, hkv, n, r, CHUNK), p.bias, d, p.softcap)  # [B, Hkv, N, R, C]
    top = scores.amax((2, 4), keepdim=True).clamp_(min=-1e30)  # [B, Hkv, 1, R, 1]
    w = row_invariant(torch.exp_, scores.sub_(top)).view(b * hkv * n, r, CHUNK)  # hidden slots: exactly 0
    # 3. per chunk [p.v | p.1] -> [numerator | softmax sum]; chunks added in slot order (a sequential scan)
    acc = torch.bmm(w, p.v3).view(b * hkv, n, r, d + 1)
    total = acc[:, 0] if n == 1 else acc.cumsum(1)[:, -1]  # [B*Hkv, R, D + 1]
    num = total[:, :rows, :d].view(b, hkv, g, s, d)
    den = total[:, :rows, d:].clamp_(min=torch.finfo(torch.float32).tiny).view(b, hkv, g, s, 1)  # sees nothing: 0
    # 4. divide into the [B, S, H, D] result (rounded once to q's dtype), the layout the output projection reads
    if p.out is None or p.out.dtype != q.dtype:
        p.out = torch.empty(b, s, h, d, dtype=q.dtype, device=q.device)
    torch.div(num, den, out=p.out.view(b, s, hkv, g, d).permute(0, 2, 3, 1, 4))
    return p.out.transpose(1, 2)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: AttentionPlan) -> torch.Tensor:
    """`invariant_attention` for tree masks: each query computes what its AR step computes. Scores come from one GEMM
    per chunk of the cache's own layout, reordered per query into AR's; values past the `p.shared_chunks` chunks of
    the committed prefix (used in place) are copied per query in AR's order."""
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    group, n, rg = h // hkv, p.tree_bias.shape[3], p.tree_bias.shape[4]
    c0 = p.shared_chunks
    lo = c0 * CHUNK  # slots [0, lo): shared; [lo, t): per query
    p.k.narrow(2, 0, t).copy_(k)  # the cache's own layout, padded to whole chunks
    p.v_real.narrow(2, 0, lo).copy_(v[:, :, :lo])  # the shared chunks, used in place (p.v's ones column beside them)
    qq = torch.zeros(b, hkv, s, rg, d, dtype=torch.float32, device=q.device)
    qq[:, :, :, :group] = q.float().view(b, hkv, group, s, d).transpose(2, 3)  # rows: the query's G heads
    q_rows = qq.view(b, hkv, 1, s * rg, d)  # every query's rows in one GEMM per chunk (row-independent products)
    raw = torch.matmul(q_rows, p.k.view(b, hkv, n, CHUNK, d).transpose(-1, -2))  # [B, Hkv, N, S*RG, C]
    raw = raw.view(b, hkv, n, s, rg, CHUNK).permute(0, 1, 3, 4, 2, 5).reshape(b, hkv, s, rg, n * CHUNK)
    # a score is one dot product, wherever its key sits in a GEMM: reorder each query's columns into AR's layout
    scores = raw.gather(4, p.score_cols[:, None, :, None, :].expand(b, hkv, s, rg, n * CHUNK))
    scores = scores.view(b, hkv, s, rg, n, CHUNK).transpose(3, 4)  # [B, Hkv, S, N, RG, C]
    # each query's [v | 1] from lo on, in its AR order: whole [Hkv, D] rows picked from the cache by slot
    e = d + 1
    vq = torch.empty(b, hkv, s, (n - c0) * CHUNK, e, dtype=torch.float32, device=q.device)
    picked = v.transpose(1, 2).reshape(b * t, hkv, d).index_select(0, p.value_rows)  # [B*S*(T-lo), Hkv, D]
    vq[:, :, :, : t - lo, :d] = picked.view(b, s, t - lo, hkv, d).permute(0, 3, 1, 2, 4)  # cast to float32 here
    vq[:, :, :, : t - lo, d] = 1  # the softmax sums' column, as p.v's
    vq[:, :, :, t - lo :] = 0  # padding past the keys: finite, and hidden (p = 0 exactly)
    scores = masked_scores(scores, p.tree_bias.squeeze(1).unsqueeze(1), d, p.softcap)  # [B, Hkv, S, N, RG, C]
    top = scores.amax(dim=(3, 5), keepdim=True).clamp_(min=-1e30)  # [B, Hkv, S, 1, RG, 1]
    w = row_invariant(torch.exp_, scores.sub_(top))
    acc = torch.matmul(w[:, :, :, c0:], vq.view(b, hkv, s, n - c0, CHUNK, e))  # [B, Hkv, S, N - c0, RG, E]
    if c0:
        ws = w[:, :, :, :c0].permute(0, 1, 3, 2, 4, 5).reshape(b, hkv, c0, s * rg, CHUNK)
        head = torch.matmul(ws, p.v[:, :, :lo].view(b, hkv, c0, CHUNK, e))  # [B, Hkv, c0, S*RG, E]: in place
        acc = torch.cat([head.view(b, hkv, c0, s, rg, e).permute(0, 1, 3, 2, 4, 5), acc], 3)
    total = acc.cumsum(3)[:, :, :, -1, :group]  # [B, Hkv, S, G, E]
    out = total[..., :d] / total[..., d:].clamp_(min=torch.finfo(torch.float32).tiny)
    return out.transpose(2, 3).reshape(b, h, s, d).to(q.dtype)
