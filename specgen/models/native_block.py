"""A float32 decoder block's decode forward as a straight run of native calls: the same kernels, in the same order,
as `Block.forward` takes through its modules, without the modules.

Why: on the native path a block's work is five tiled products, two norms, one attention call and three torch ops
(SiLU, product, residual add; a mesh decoder's block adds a cross-attention: a norm, two products and SDPA). Reaching
them through nine module calls, `PackedLinear.forward`'s kernel checks and the wrappers' reshapes costs tens of
microseconds a layer, which small models feel most (docs/results/batching.md, "A block in one call"). Here the checks
run once a block and every call gets its buffers and pointers directly.

Bitwise the module path: each kernel gets the same inputs (rows are contiguous [B * S, features] either way) and
SiLU, the gate product, SDPA and the residual adds are the same torch ops (tests/models/test_native_block.py). So every
forward that takes it (AR steps, verify and drafter forwards alike) computes what the module path computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen import native
from specgen.models.attention import NativePlan, native_self_attention
from specgen.models.packed_linear import PackedLinear
from specgen.native import ops as native_ops
from specgen.native import tiled_linear


def linears(blk) -> tuple:
    """The block's products in call order: wqkv, wo, (cross wq, cross wo,) w1, w3, w2."""
    att, ffn = blk.attention, blk.feed_forward
    cross = (blk.cross_attention.wq, blk.cross_attention.wo) if hasattr(blk, "cross_attention") else ()
    return att.wqkv, att.wo, *cross, ffn.w1, ffn.w3, ffn.w2


def norms(blk) -> tuple:
    """The block's RMSNorms: attention, (cross,) FFN."""
    cross = (blk.cross_norm,) if hasattr(blk, "cross_attention") else ()
    return blk.attention_norm, *cross, blk.ffn_norm


def usable(blk, x: torch.Tensor, mask, cross_kv) -> bool:
    """Whether this forward may run here: float32 on a CPU with the native kernels, no gradient, a block without q/k
    norms over a native plan that places the new keys (a cross-attention block with its condition's keys and values),
    and all its products on one model's kernel choice naming the tiled loop for this many rows (else the module path,
    whatever kernel it picks)."""
    crossing = hasattr(blk, "cross_attention")
    if (not isinstance(mask, NativePlan) or mask.slots is None or x.dtype != torch.float32 or x.device.type != "cpu"
            or torch.is_grad_enabled() or blk.attention.cfg.qk_norm or (cross_kv is not None) != crossing
            or not native_ops.usable(x, *(n.weight for n in norms(blk))) or not tiled_linear.available()
            or native.attention() is None):
        return False
    lins = linears(blk)
    if any(type(lin) is not PackedLinear for lin in lins):  # e.g. plain nn.Linear (unpacked) or a LoRA wrapper
        return False
    choice = lins[0]._choice
    if choice is None or any(lin._choice is not choice or lin.weight.dtype != torch.float32 for lin in lins):
        return False
    return choice.plan().kernel(x.numel() // x.shape[-1]) == "native"


def product(lin: PackedLinear, x: torch.Tensor, rows: int, threads: int) -> torch.Tensor:
    """lin(x) for contiguous x [..., in] on the tiled loop: [rows, out]."""
    tiles, bias = lin.tiled_weight()
    out = torch.empty(rows, lin.out_features)
    native.tiled().specgen_tiled_linear(x.data_ptr(), tiles.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                        out.data_ptr(), rows, lin.in_features, lin.out_features, threads)
    return out


def rms_norm(norm, x: torch.Tensor, rows: int) -> torch.Tensor:
    """norm(x) for contiguous float32 x [..., dim] (glue.c, as RMSNorm.forward calls it)."""
    out = torch.empty_like(x)
    native_ops.check(native.glue().specgen_rms_norm(x.data_ptr(), norm.weight.data_ptr(), out.data_ptr(), rows,
                                                    x.shape[-1], norm.eps, 4))
    return out


def forward(blk, x: torch.Tensor, rot, layer: int, cache, p: NativePlan, cross_kv=None) -> torch.Tensor:
    """Block.forward for `usable` inputs: x [B, S, dim] -> [B, S, dim]."""
    b, s, dim = x.shape
    rows, threads = b * s, torch.get_num_threads()
    lins = linears(blk)
    wqkv, wo, w1, w3, w2 = lins[0], lins[1], *lins[-3:]
    x = x.contiguous()
    # 1. attention: pre-norm, fused QKV, RoPE + cache write + attention in one call, output projection
    qkv = product(wqkv, rms_norm(blk.attention_norm, x, rows), rows, threads).view(b, s, -1)  # [B, S, (H+2Hkv) hd]
    a = product(wo, native_self_attention(qkv, rot, *cache.layer(layer), p), rows, threads)  # [B*S, dim]
    if cross_kv is None:  # 2. residual add and the FFN's pre-norm in one pass
        total, normed = torch.empty_like(x), torch.empty_like(x)
        native_ops.check(native.glue().specgen_add_rms_norm(
            x.data_ptr(), a.data_ptr(), blk.ffn_norm.weight.data_ptr(), total.data_ptr(), normed.data_ptr(), rows,
            dim, blk.ffn_norm.eps, 4))
    else:  # 2'. residual add, cross-attention to the condition (SDPA, as CrossAttention.forward), add, FFN pre-norm
        total = x + a.view(b, s, dim)
        wq, wo_cross = lins[2], lins[3]
        heads, hd = blk.cross_attention.cfg.n_heads, blk.cross_attention.cfg.hd
        q = product(wq, rms_norm(blk.cross_norm, total, rows), rows, threads).view(b, s, heads, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, cross_kv[0], cross_kv[1])  # [B, H, S, hd]
        total = total + product(wo_cross, y.transpose(1, 2).reshape(b, s, -1), rows, threads).view(b, s, dim)
        normed = rms_norm(blk.ffn_norm, total, rows)
    # 3. SwiGLU (the module's torch ops) and the second residual add
    gate = F.silu(product(w1, normed, rows, threads)) * product(w3, normed, rows, threads)  # [B*S, ffn]
    return total + product(w2, gate, rows, threads).view(b, s, dim)
