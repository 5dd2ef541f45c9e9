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
are padded to `MIN_ROWS` GEMM rows: MKL computes products of fewer rows on another path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 128  # key slots per chunk
MIN_ROWS = 4  # GEMM rows below which MKL's float32 products take another code path


def chunk_bias(
    mask: torch.Tensor | None,  # [B, 1, S, T] bool (True = visible), None = every slot visible
    b: int, s: int, t: int, group: int, device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Additive float32 mask [B, 1, N, G*S, CHUNK] (0 visible, -inf hidden; rows ordered (g, s)), made once per
    forward and shared by every layer."""
    n = -(-t // CHUNK)
    if mask is None:
        mask = torch.ones(b, 1, s, t, dtype=torch.bool, device=device)
    vis = F.pad(mask, (0, n * CHUNK - t), value=False).view(mask.shape[0], 1, s, n, CHUNK).permute(0, 1, 3, 2, 4)
    vis = vis.unsqueeze(3).expand(-1, 1, n, group, s, CHUNK).reshape(-1, 1, n, group * s, CHUNK)
    bias = torch.zeros(vis.shape, dtype=torch.float32, device=device)
    return bias.masked_fill_(~vis, float("-inf"))


def invariant_attention(
    q: torch.Tensor,  # [B, H, S, D]
    k: torch.Tensor,  # [B, Hkv, T, D] (slots 0 .. T-1 of the cache)
    v: torch.Tensor,  # [B, Hkv, T, D]
    bias: torch.Tensor,  # [B, 1, N, G*S, CHUNK] from chunk_bias
) -> torch.Tensor:
    """Softmax attention [B, H, S, D] in float32 (returned in q's dtype), GQA when Hkv < H."""
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    g = h // hkv
    n = bias.shape[2]
    pad = n * CHUNK - t
    rows = g * s
    qf = q.float().reshape(b, hkv, 1, rows, d) * d**-0.5  # [B, Hkv, 1, G*S, D]; rows ordered (g, s)
    if rows < MIN_ROWS:
        qf = F.pad(qf, (0, 0, 0, MIN_ROWS - rows))
    kf = F.pad(k.float(), (0, 0, 0, pad)).view(b, hkv, n, CHUNK, d)  # [B, Hkv, N, C, D]
    vf = F.pad(v.float(), (0, 0, 0, pad)).view(b, hkv, n, CHUNK, d)
    scores = torch.matmul(qf, kf.transpose(-1, -2))[..., :rows, :] + bias  # [B, Hkv, N, G*S, C]
    top = scores.amax(dim=(2, 4), keepdim=True).clamp_(min=-1e30)  # [B, Hkv, 1, G*S, 1]; exact (a max)
    p = torch.exp_(scores.sub_(top))  # hidden slots: exactly 0
    denom = p.sum(-1).cumsum(2)[:, :, -1]  # [B, Hkv, G*S]: chunk sums added in slot order
    if rows < MIN_ROWS:
        p = F.pad(p, (0, 0, 0, MIN_ROWS - rows))
    out = torch.matmul(p, vf)[..., :rows, :].cumsum(2)[:, :, -1]  # [B, Hkv, G*S, D]
    out = out / denom.clamp_(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)  # a query seeing nothing: 0
    return out.view(b, hkv, g, s, d).reshape(b, h, s, d).to(q.dtype)
