"""A float32 block's decode forward as a straight run of native calls: `Block.forward`'s kernels and order, bitwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.models.attention import NativePlan, native_self_attention
from specgen.models.kernel_choice import native_norms
from specgen.models.packed_linear import PackedLinear
from specgen.native import ops


def linears(blk) -> tuple:
    """The block's products in call order: wqkv, wo, (cross wq, cross wo,) w1, w3, w2."""
    att, ffn = blk.attention, blk.feed_forward
    cross = (blk.cross_attention.wq, blk.cross_attention.wo) if hasattr(blk, "cross_attention") else ()
    return att.wqkv, att.wo, *cross, ffn.w1, ffn.w3, ffn.w2


def usable(blk, x: torch.Tensor, mask, cross_kv) -> bool:
    """Whether this forward may run here: float32, native norms, a block without q/k norms over a NativePlan that
    places the new keys (with its condition's K/V if it cross-attends), all products on one plan naming tiled.c."""
    cross = hasattr(blk, "cross_attention")
    norms = (blk.attention_norm, *((blk.cross_norm,) if cross else ()), blk.ffn_norm)
    if (not isinstance(mask, NativePlan) or mask.slots is None or x.dtype != torch.float32
            or blk.attention.cfg.qk_norm or (cross_kv is not None) != cross
            or not native_norms(x, *(n.weight for n in norms))):
        return False
    lins = linears(blk)  # not a PackedLinear: e.g. plain nn.Linear (unpacked) or a LoRA wrapper
    if any(type(lin) is not PackedLinear or lin._choice is not lins[0]._choice or lin.weight.dtype != torch.float32
           for lin in lins):
        return False
    return lins[0]._choice.plan().kernel(x.numel() // x.shape[-1]) == "native"


def product(lin: PackedLinear, x: torch.Tensor, threads: int) -> torch.Tensor:
    """lin(x) for x [..., in] on the tiled loop: [..., out]."""
    return ops.tiled_linear(x, *lin.tiled_weight(), lin.out_features, threads)


def forward(blk, x: torch.Tensor, rot, layer: int, cache, p: NativePlan, cross_kv=None) -> torch.Tensor:
    """Block.forward for `usable` inputs: x [B, S, dim] -> [B, S, dim]."""
    b, s, dim = x.shape
    threads = torch.get_num_threads()
    lins = linears(blk)
    wqkv, wo, w1, w3, w2 = lins[0], lins[1], *lins[-3:]
    # 1. attention: pre-norm, fused QKV, RoPE + cache write + attention in one call, output projection
    normed = torch.ops.specgen.rms_norm(x, blk.attention_norm.weight, blk.attention_norm.eps)  # [B, S, dim]
    qkv = product(wqkv, normed, threads).view(b, s, -1)  # [B, S, (H + 2 Hkv) hd]
    a = product(wo, native_self_attention(qkv, rot, *cache.layers[layer], p), threads)  # [B*S, dim]
    if cross_kv is None:  # 2. residual add and the FFN's pre-norm in one pass
        total, normed = torch.ops.specgen.add_rms_norm(x, a.view(b, s, dim), blk.ffn_norm.weight, blk.ffn_norm.eps)
    else:  # 2'. residual add and pre-norm, cross-attention to the condition (SDPA, as CrossAttention.forward), add
        # and FFN pre-norm: each add in its norm's pass
        total, c = torch.ops.specgen.add_rms_norm(x, a.view(b, s, dim), blk.cross_norm.weight, blk.cross_norm.eps)
        wq, wo_cross = lins[2], lins[3]
        heads, hd = blk.cross_attention.n_heads, blk.cross_attention.hd
        q = product(wq, c, threads).view(b, s, heads, hd).transpose(1, 2)  # [B, H, S, hd]
        y = F.scaled_dot_product_attention(q, cross_kv[0], cross_kv[1])  # [B, H, S, hd]
        y = product(wo_cross, y.transpose(1, 2).reshape(b, s, -1), threads).view(b, s, dim)
        total, normed = torch.ops.specgen.add_rms_norm(total, y, blk.ffn_norm.weight, blk.ffn_norm.eps)
    # 3. SwiGLU (the module's torch ops) and the second residual add
    gate = F.silu(product(w1, normed, threads)) * product(w3, normed, threads)  # [B*S, ffn]
    return total + product(w2, gate, threads).view(b, s, dim)
