"""Attention whose result for a query depends only on that query and the keys it sees (batch- and width-invariant).

`F.scaled_dot_product_attention` picks its reduction order from the number of queries and keys, so a token scored
alone (an AR step, keys [0, n]) and the same token inside a verification forward (keys [0, n + S)) get results
that differ in the last bits. In float32 those bits almost never move an argmax; a bfloat16 or quantized target
rounds every activation to 8 bits, the difference survives the rounding, and on SmolLM2 a greedy verification
then disagrees with AR at near-ties (docs/logs/attention-invariance.log). Speculation is lossless only if the
verifying forward computes exactly what AR computes, so low-precision targets use this instead.

How the order is fixed: keys are cut into chunks of `CHUNK` slots aligned at slot 0 (the cache slot index, so a
key lands in the same chunk in every forward); per chunk, q.k^T and p.v are float32 GEMMs with the same inner size
(D, resp. CHUNK) for every forward, the softmax max is exact, and chunk sums are added in slot order by `cumsum`
(a sequential scan). Slots a query cannot see get p = 0 exactly, so chunks past its keys add exact zeros. Queries
are padded to `MIN_ROWS` GEMM rows: MKL computes products of fewer rows on another path. Each GEMM row is one
query (row-independent products), so padding rows and other queries never touch a query's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 128  # key slots per chunk
MIN_ROWS = 4  # GEMM rows below which MKL's float32 products take another code path


@dataclass
class AttentionPlan:
    """What every layer of one forward shares: the additive mask and float32 staging buffers (zero-padded past
    the real keys and query rows; each layer overwrites only the real part, so the padding stays finite)."""

    bias: torch.Tensor  # [B, 1, N, R, CHUNK] 0 visible / -inf hidden; R = max(G*S, MIN_ROWS), rows ordered (g, s)
    q: torch.Tensor  # [B, Hkv, 1, R, D]
    k: torch.Tensor  # [B, Hkv, N*CHUNK, D]
    v: torch.Tensor  # [B, Hkv, N*CHUNK, D]
    rows: int  # G*S


def plan(
    mask: torch.Tensor | None,  # [B, 1, S, T] bool (True = visible), None = every slot visible
    b: int, s: int, t: int, heads: int, kv_heads: int, head_dim: int, device: torch.device | str = "cpu",
) -> AttentionPlan:
    """The plan of a forward of S queries over T key slots (made once, used by every layer)."""
    n, group = -(-t // CHUNK), heads // kv_heads
    rows = group * s
    if mask is None:
        mask = torch.ones(b, 1, s, t, dtype=torch.bool, device=device)
    vis = F.pad(mask, (0, n * CHUNK - t), value=False).view(mask.shape[0], 1, s, n, CHUNK).permute(0, 1, 3, 2, 4)
    vis = vis.unsqueeze(3).expand(-1, 1, n, group, s, CHUNK).reshape(-1, 1, n, rows, CHUNK)
    vis = F.pad(vis, (0, 0, 0, max(0, MIN_ROWS - rows)), value=True)  # padding rows: finite, then dropped
    bias = torch.zeros(vis.shape, dtype=torch.float32, device=device).masked_fill_(~vis, float("-inf"))
    f32 = dict(dtype=torch.float32, device=device)
    return AttentionPlan(bias, torch.zeros(b, kv_heads, 1, vis.shape[3], head_dim, **f32),
                         torch.zeros(b, kv_heads, n * CHUNK, head_dim, **f32),
                         torch.zeros(b, kv_heads, n * CHUNK, head_dim, **f32), rows)


def invariant_attention(
    q: torch.Tensor,  # [B, H, S, D]
    k: torch.Tensor,  # [B, Hkv, T, D] (slots 0 .. T-1 of the cache)
    v: torch.Tensor,  # [B, Hkv, T, D]
    p: AttentionPlan,
) -> torch.Tensor:
    """Softmax attention [B, H, S, D] in float32 (returned in q's dtype), GQA when Hkv < H."""
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    n, rows = p.bias.shape[2], p.rows
    p.q[:, :, 0, :rows].copy_(q.reshape(b, hkv, rows, d))  # rows ordered (g, s); padding rows stay 0
    p.k[:, :, :t].copy_(k)
    p.v[:, :, :t].copy_(v)
    kf = p.k.view(b, hkv, n, CHUNK, d)  # [B, Hkv, N, C, D]
    scores = torch.matmul(p.q, kf.transpose(-1, -2)).mul_(d**-0.5).add_(p.bias)  # [B, Hkv, N, R, C]
    top = scores.amax(dim=(2, 4), keepdim=True).clamp_(min=-1e30)  # [B, Hkv, 1, R, 1]; exact (a max)
    w = torch.exp_(scores.sub_(top))  # hidden slots: exactly 0
    denom = w.sum(-1).cumsum(2)[:, :, -1, :rows]  # [B, Hkv, G*S]: chunk sums added in slot order
    out = torch.matmul(w, p.v.view(b, hkv, n, CHUNK, d)).cumsum(2)[:, :, -1, :rows]  # [B, Hkv, G*S, D]
    out = out / denom.clamp_(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)  # a query seeing nothing: 0
    return out.view(b, hkv, h // hkv, s, d).reshape(b, h, s, d).to(q.dtype)
