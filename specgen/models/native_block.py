"""A block's decode forward as a straight run of native calls: `Block.forward`'s kernels and order, bitwise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specgen import native
from specgen.models import kernel_choice, prompt
from specgen.models.attention import NativePlan, native_self_attention
from specgen.models.elementwise import row_invariant
from specgen.models.packed_linear import PackedLinear
from specgen.native import ops


@dataclass(frozen=True)
class Products:
    """How the products of one kind of layer run in the straight run (one kind per model: KINDS)."""

    ready: Callable[[tuple, int], bool]  # (the block's products, the forward's rows) -> whether all are native here
    product: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]  # (layer, x [..., in], threads) -> [..., out]
    gate: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]  # (feed-forward, x, threads) -> silu(w1 x) * w3 x


def tiled_ready(lins: tuple, rows: int) -> bool:
    """float32 PackedLinears, whose decode products run tiled.c at every row count (`kernel_choice.tiled_products`);
    one of another class (a plain nn.Linear, a LoRA wrapper) keeps the module path."""
    return native.library("tiled") is not None and all(
        type(lin) is PackedLinear and lin._parameters["weight"].dtype == torch.float32 for lin in lins)


def tiled_product(lin: PackedLinear, x: torch.Tensor, threads: int) -> torch.Tensor:
    """lin(x) for x [..., in] on the tiled loop: [..., out]."""
    return lin.tiled(x, threads)


def swiglu(product: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]):
    """FeedForward's SwiGLU gate (its torch ops) over `product`: (feed-forward, x, threads) -> [..., ffn]."""
    def gate(ffn: nn.Module, x: torch.Tensor, threads: int) -> torch.Tensor:
        w = ffn._modules  # past nn.Module.__getattr__, as `linears`
        return row_invariant(F.silu, product(w["w1"], x, threads)) * product(w["w3"], x, threads)
    return gate


def half_ready(lins: tuple, rows: int) -> bool:
    """bfloat16 PackedLinears outside a prompt prefill (which runs oneDNN unsliced), tiled.c built (the kernel of
    those `kernel_choice.amx_slices` does not take)."""
    return native.library("tiled") is not None and not prompt.active() and all(
        type(lin) is PackedLinear and lin._parameters["weight"].dtype == torch.bfloat16 for lin in lins)


def half_product(lin: PackedLinear, x: torch.Tensor, threads: int) -> torch.Tensor:
    """PackedLinear.forward of a bfloat16 decode x [..., in] (`usable` and `half_ready` checked grad mode, the device
    and the prefill): oneDNN's AMX slices, else tiled.c over float32 tiles."""
    return lin.sliced(x) if kernel_choice.amx_weight(lin._parameters["weight"]) else lin.tiled(x, threads)


#: product kinds by (layer class, activation dtype); quantize.py adds QuantizedLinear's (qmm.c) where it is defined
KINDS: dict[tuple[type, torch.dtype], Products] = {
    (PackedLinear, torch.float32): Products(tiled_ready, tiled_product, swiglu(tiled_product)),
    (PackedLinear, torch.bfloat16): Products(half_ready, half_product, swiglu(half_product))}


def linears(blk) -> tuple:
    """The block's products in call order: wqkv, wo, (cross wq, cross wo,) then its feed-forward's (w1, w3, w2, or
    a quantized w13, w2). Read from `_modules`: nn.Module.__getattr__ costs ~1 us a name, and `usable` runs per block
    of every decode step."""
    mods = blk._modules
    att = mods["attention"]._modules
    cross = mods.get("cross_attention")
    return (att["wqkv"], att["wo"], *(() if cross is None else (cross._modules["wq"], cross._modules["wo"])),
            *mods["feed_forward"]._modules.values())


NORMS = ("attention_norm", "cross_norm", "ffn_norm")  # a block's RMSNorms (cross_norm: with cross-attention)


def usable(blk, x: torch.Tensor, mask, cross_kv) -> Products | None:
    """The block's product kind where this forward may run here, else None: grad mode off, a NativePlan that places
    the new keys (with its condition's K/V if the block cross-attends), Llama's block (pre-norms, no q/k norms,
    sandwich norms, gate other than SwiGLU or routed experts: the kernels implement none of them), native norms in the
    kind's dtype, and every product of that kind and native at this row count."""
    if type(mask) is not NativePlan or mask.slots is None or torch.is_grad_enabled():
        return None
    mods = blk._modules  # past nn.Module.__getattr__, as `linears`
    lins = linears(blk)
    kind = KINDS.get((type(lins[0]), x.dtype))
    cfg = mods["attention"].cfg
    if (kind is None or x.device.type != "cpu" or cfg.qk_norm or cfg.sandwich_norms
            or not cfg.pre_norms or cfg.ffn_act != "silu" or cfg.n_experts
            or (cross_kv is not None) != ("cross_attention" in mods) or native.library("glue") is None
            or any(mods[n]._parameters["weight"].dtype != x.dtype for n in NORMS if n in mods)):
        return None
    return kind if kind.ready(lins, x.numel() // x.shape[-1]) else None


def forward(blk, kind: Products, x: torch.Tensor, rot, layer: int, cache, p: NativePlan,
            cross_kv=None) -> torch.Tensor:
    """Block.forward for `usable` inputs (its answer is `kind`): x [B, S, dim] -> [B, S, dim]."""
    b, s, dim = x.shape
    threads = torch.get_num_threads()
    mods, product = blk._modules, kind.product  # past nn.Module.__getattr__, as `linears`
    lins = linears(blk)  # wqkv, wo, then cross wq and wo where the block cross-attends
    att_norm, ffn_norm, ffn = mods["attention_norm"], mods["ffn_norm"], mods["feed_forward"]
    # 1. attention: pre-norm, fused QKV, RoPE + cache write + attention in one call, output projection
    normed = ops.rms_norm(x, att_norm._parameters["weight"], att_norm.eps)  # [B, S, dim]
    qkv = product(lins[0], normed, threads).view(b, s, -1)  # [B, S, (H + 2 Hkv) hd]
    a = product(lins[1], native_self_attention(qkv, rot, *cache.layers[layer], p), threads).view(b, s, dim)
    if cross_kv is None:  # 2. residual add and the FFN's pre-norm in one pass
        total, normed = ops.add_rms_norm(x, a, ffn_norm._parameters["weight"], ffn_norm.eps)
    else:  # 2'. residual add and pre-norm, cross-attention to the condition (SDPA, as CrossAttention.forward), add
        # and FFN pre-norm: each add in its norm's pass
        cross_norm, ca = mods["cross_norm"], mods["cross_attention"]
        total, c = ops.add_rms_norm(x, a, cross_norm._parameters["weight"], cross_norm.eps)
        q = product(lins[2], c, threads).view(b, s, ca.n_heads, ca.hd).transpose(1, 2)  # [B, H, S, hd]
        y = F.scaled_dot_product_attention(q, cross_kv[0], cross_kv[1])  # [B, H, S, hd]
        y = product(lins[3], y.transpose(1, 2).reshape(b, s, -1), threads).view(b, s, dim)
        total, normed = ops.add_rms_norm(total, y, ffn_norm._parameters["weight"], ffn_norm.eps)
    # 3. SwiGLU (the module's torch ops) and the second residual add
    return total + product(ffn._modules["w2"], kind.gate(ffn, normed, threads), threads).view(b, s, dim)
