"""The one decoder specgen owns: Llama-family blocks (LlamaGen's/gpt-fast's names) over a static KV cache."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from specgen.errors import ContextOverflowError
from specgen.models import kernel_choice, native_block
from specgen.devices import host_inputs, host_tensor
from specgen.models.attention import (PLANS, NativePlan, capped_attention, in_window, invariant_attention,
                                      key_positions, native_self_attention, plan)
from specgen.models.cache import KVCache
from specgen.models.elementwise import row_invariant
from specgen.models.kernel_choice import attention_path, native_norms
from specgen.models.moe import MoEFeedForward
from specgen.models.rope import (PER_FREQUENCY, SCALINGS, Rotation, layout_table, rows_rotation, still, table_1d,
                                 table_2d)


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a decoder; JSON-serialisable (saved next to every checkpoint)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    head_dim: int = 0  # 0: dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_layout: str = "half"  # "half" | "interleaved" (see models/rope.py)
    rope_grid: int = 0  # > 0: LlamaGen 2D RoPE over a rope_grid x rope_grid image after n_cond tokens
    n_cond: int = 0  # condition tokens before the sequence (zero RoPE rows in 2D mode)
    max_seq_len: int = 2048
    qkv_bias: bool = False
    tie_embeddings: bool = True
    cross_dim: int = 0  # > 0: cross-attention to a condition of this width in every block
    num_classes: int = 0  # > 0: LlamaGen c2i class embedding (row num_classes = the null class for CFG)
    caption_dim: int = 0  # > 0: LlamaGen t2i caption embedding (n_cond caption features of this width)
    rope_scaling: dict | None = None  # 1D context extension, as HF's rope_parameters (models/rope.scaled_inv_freq)
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k (weights [hd]) before RoPE
    qk_norm_span: str = "head"  # the q/k norms' span (QK_NORM_SPANS): "head", or "all" (OLMo 2: q's and k's whole rows)
    rope_dim: int = 0  # > 0: partial RoPE (Phi-4-mini), only this many of a head's dims rotate (rope.spread_order)
    nope_layers: tuple[int, ...] = ()  # SmolLM3: the layers whose attention applies no RoPE (`layer_rotations`)
    embed_scale: float = 1.0  # Gemma: sqrt(dim); the input embeddings times this, rounded to their dtype (`embed`)
    ffn_act: str = "silu"  # the gate's activation (ACTIVATIONS): "silu" (SwiGLU), "gelu_tanh" (Gemma's GeGLU)
    sandwich_norms: bool = False  # Gemma: each sublayer's output normed before its residual add (Block)
    pre_norms: bool = True  # False: OLMo 2, no norm before a block's sublayers (its sandwich norms its outputs: Block)
    local_layers: tuple[int, ...] = ()  # the sliding-attention layers: `window` (`layer_masks`), Gemma's RoPE base
    local_rope_theta: float = 0.0  # > 0: the local layers' own RoPE base (Gemma's, unscaled; `layer_rotations`)
    window: int = 0  # > 0: a local layer's query at position p sees keys at p - window + 1 .. p (0: all, as before)
    attn_softcap: float = 0.0  # > 0: Gemma 2: each scaled score s becomes cap tanh(s / cap) before the mask
    logit_softcap: float = 0.0  # > 0: Gemma 2: each logit z becomes cap tanh(z / cap) (`Transformer.logits`)
    logit_scale: float = 1.0  # Granite's logits_scaling: each logit divided by it (`Transformer.logits`; a tied head
    # is the embedding too, so no weight can hold it)
    n_experts: int = 0  # > 0: each block's feed-forward routes a row to experts_per_token of this many (models/moe.py)
    experts_per_token: int = 0  # k, with n_experts (each expert a SwiGLU of ffn_dim)
    expert_renorm: bool = False  # the k router weights renormalised to sum 1 (Mixtral; Qwen3-MoE's norm_topk_prob)
    expert_weight_round: bool = False  # the k weights rounded to the activation dtype before they scale (Qwen3-MoE)
    shared_expert_dim: int = 0  # > 0: Qwen2-MoE's shared expert, a SwiGLU of this width on every row (models/moe.py)

    def __post_init__(self) -> None:
        flag = next((f.name for f in fields(self) if f.type == "bool" and type(getattr(self, f.name)) is not bool),
                    None)
        if flag is not None:  # a hand-edited entry's "yes" would read as true
            raise ValueError(f"{flag} {getattr(self, flag)!r} is not true or false")
        if self.num_classes and self.caption_dim:
            raise ValueError("a model is class-conditional (num_classes) or text-conditional (caption_dim), not both")
        if self.caption_dim and self.n_cond < 1:
            raise ValueError("a text-conditional model needs n_cond >= 1 caption slots")
        if self.rope_scaling and (self.rope_grid or self.rope_scaling.get("rope_type") not in SCALINGS):
            raise ValueError(f"rope_scaling {self.rope_scaling} is not a 1D scaling of {', '.join(SCALINGS)}")
        if self.rope_dim and not (0 < self.rope_dim <= self.hd and self.rope_dim % 2 == 0
                                  and self.rope_layout == "half" and not self.rope_grid):
            raise ValueError(f"partial RoPE over {self.rope_dim} of {self.hd} dims: needs an even number of them, "
                             "1D RoPE and the half layout")
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))  # a JSON list, read back: one value
        if list(self.nope_layers) != sorted(set(self.nope_layers)) or not all(
                isinstance(i, int) and 0 <= i < self.n_layers for i in self.nope_layers) or (
                self.nope_layers and self.rope_grid):
            raise ValueError(f"nope_layers {list(self.nope_layers)} must be distinct increasing layer numbers below "
                             f"n_layers {self.n_layers}, in a 1D RoPE model")
        self.check_gemma_fields()
        self.check_expert_fields()
        if not (type(self.qk_norm_span) is str and self.qk_norm_span in QK_NORM_SPANS) or (
                self.qk_norm_span != "head" and not self.qk_norm):
            raise ValueError(f"qk_norm_span {self.qk_norm_span!r} must be one of {', '.join(QK_NORM_SPANS)}, and "
                             "head without qk_norm")
        if not (self.pre_norms or self.sandwich_norms):  # a block that norms nothing: no model specgen loads
            raise ValueError("a block without pre-norms (pre_norms false) needs sandwich_norms (OLMo 2's block)")
        for key in PER_FREQUENCY.get((self.rope_scaling or {}).get("rope_type"), ()):
            factors = self.rope_scaling.get(key)
            if not isinstance(factors, list) or len(factors) != self.rotary_dim // 2 or not all(
                    isinstance(f, (int, float)) and 0 < f < float("inf") for f in factors):
                raise ValueError(f"RoPE {key} must be a list of {self.rotary_dim // 2} positive finite numbers (one a "
                                 f"frequency of {self.rotary_dim} rotary dims): {str(factors)[:80]}")

    def check_gemma_fields(self) -> None:
        """The fields Gemma (and Granite) add: positive embedding and logit scales, softcaps that are positive or 0
        (none), a known activation, local (sliding) layers that are layers with a window or their own positive RoPE
        base (then not NoPE ones), all in a 1D text model without cross-attention."""
        object.__setattr__(self, "local_layers", tuple(self.local_layers))  # a JSON list, read back: one value
        if not (type(self.embed_scale) in (int, float) and 0 < self.embed_scale < math.inf):
            raise ValueError(f"embed_scale {self.embed_scale!r} is not a positive number")
        if not (type(self.logit_scale) in (int, float) and 0 < self.logit_scale < math.inf):
            raise ValueError(f"logit_scale {self.logit_scale!r} is not a positive number")
        for name in ("attn_softcap", "logit_softcap"):
            if not (type(getattr(self, name)) in (int, float) and 0 <= getattr(self, name) < math.inf):
                raise ValueError(f"{name} {getattr(self, name)!r} is not a positive number or 0 (none)")
        if self.ffn_act not in ACTIVATIONS:
            raise ValueError(f"ffn_act {self.ffn_act!r} is none of {', '.join(ACTIVATIONS)}")
        turned = self.local_rope_theta > 0  # the local layers turn with their own table: none of them NoPE
        if list(self.local_layers) != sorted(set(self.local_layers)) or not all(
                isinstance(i, int) and 0 <= i < self.n_layers and not (turned and i in self.nope_layers)
                for i in self.local_layers):
            raise ValueError(f"local_layers {list(self.local_layers)} must be distinct increasing layer numbers below "
                             f"n_layers {self.n_layers}, none of them NoPE where local_rope_theta is set")
        if type(self.window) is not int or self.window < 0:
            raise ValueError(f"window {self.window!r} is not a window size (a positive int, or 0: none)")
        if bool(self.local_layers) != (turned or self.window > 0) or (self.local_rope_theta < 0):
            raise ValueError(f"local_layers {list(self.local_layers)} need a window ({self.window}) or their own "
                             f"positive local_rope_theta ({self.local_rope_theta}), and those need local_layers")
        if (self.local_layers or self.sandwich_norms) and (self.rope_grid or self.cross_dim):
            raise ValueError("local_layers and sandwich_norms are for 1D text models without cross-attention")

    def check_expert_fields(self) -> None:
        """A routed feed-forward's fields (models/moe.py): a count of experts (0: none), k of them per token, and the
        routing flags and a shared expert's width only with experts."""
        if type(self.n_experts) is not int or self.n_experts < 0:
            raise ValueError(f"n_experts {self.n_experts!r} is not a count of experts (a positive int, or 0: none)")
        if type(self.experts_per_token) is not int or not (
                1 <= self.experts_per_token <= self.n_experts if self.n_experts else self.experts_per_token == 0):
            raise ValueError(f"experts_per_token {self.experts_per_token!r} must be 1 to n_experts "
                             f"({self.n_experts}) with experts, 0 without")
        if not self.n_experts and (self.expert_renorm or self.expert_weight_round):
            raise ValueError("expert_renorm and expert_weight_round route experts: they need n_experts")
        if type(self.shared_expert_dim) is not int or self.shared_expert_dim < 0 or (
                self.shared_expert_dim and not self.n_experts):
            raise ValueError(f"shared_expert_dim {self.shared_expert_dim!r} must be a width (a positive int, or 0: "
                             "none), and one beside routed experts (n_experts)")

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """How many of a head's dims RoPE rotates (all but in partial RoPE)."""
        return self.rope_dim or self.hd

    @property
    def cond_kind(self) -> str:
        """Which `cls_embedding` the model has: "class" (c2i), "caption" (t2i) or "none"."""
        return "caption" if self.caption_dim else "class" if self.num_classes else "none"

    def to_dict(self) -> dict:
        return asdict(self)


#: TransformerConfig.qk_norm_span -> (q's, k's) heads one norm spans: each head alone (Qwen3, Gemma 3: weights [hd]), or
#: the whole projection (OLMo 2: weights [H hd] and [Hkv hd], normed before the split into heads)
QK_NORM_SPANS = {"head": lambda cfg: (1, 1), "all": lambda cfg: (cfg.n_heads, cfg.n_kv_heads)}
#: TransformerConfig.ffn_act -> the gate's activation (transformers' `gelu_pytorch_tanh` is F.gelu's tanh form)
#: each over its elements alone (`row_invariant`): a verify row gets the bits the AR step got
ACTIVATIONS = {"silu": partial(row_invariant, F.silu),
               "gelu_tanh": partial(row_invariant, partial(F.gelu, approximate="tanh"))}


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as Llama does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if native_norms(x, self.weight):  # the same formula in one pass (its float32 sum in a fixed order)
            return torch.ops.specgen.rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """w * RMSNorm(x) with float32 statistics, rounded to x's dtype before the weight: HF's formula (F.rms_norm of
    float32 is bitwise x * rsqrt(mean(x^2) + eps), tests/models/test_rope_norm.py)."""
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class Attention(nn.Module):
    """Self-attention with fused QKV, GQA and RoPE over the cache's visible slots."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.hd, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.hd, cfg.dim, bias=False)
        if cfg.qk_norm:  # before RoPE: per head, or over q's and k's whole rows (`cfg.qk_norm_span`)
            q_heads, k_heads = QK_NORM_SPANS[cfg.qk_norm_span](cfg)
            self.q_norm = RMSNorm(q_heads * cfg.hd, cfg.norm_eps)
            self.k_norm = RMSNorm(k_heads * cfg.hd, cfg.norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, S, dim]
        rot: Rotation,  # the forward's RoPE (cos, sin [B, 1, S, hd])
        layer: int,
        cache: KVCache | None,
        mask: torch.Tensor | None,  # [B, 1, S, T] bool, or None
        causal: bool,
    ) -> torch.Tensor:
        return self.attend(self.wqkv(x), rot, layer, cache, mask, causal)

    def attend(self, projected: torch.Tensor, rot: Rotation, layer: int, cache: KVCache | None,
               mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        """`forward` after its QKV projection, projected [B, S, (H + 2 Hkv) hd] (a block may make it in its norm's
        launch: Block.deferred)."""
        b, s, _ = projected.shape
        h, hkv, hd = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.hd
        # one native call, which norms no q or k (per head or whole: either has qk_norm)
        if isinstance(mask, NativePlan) and mask.slots is not None and not self.cfg.qk_norm:
            return self.wo(native_self_attention(projected, rot, *cache.layers[layer], mask))  # (attention.py)
        if self.cfg.qk_norm_span == "all":  # OLMo 2: q's rows [B, S, H hd] and k's [B, S, Hkv hd] normed whole
            q, k, v = projected.split([h * hd, hkv * hd, hkv * hd], -1)
            projected = torch.cat([self.q_norm(q), self.k_norm(k), v], -1)  # [B, S, (H + 2 Hkv) hd]
        qkv = projected.view(b, s, h + 2 * hkv, hd).transpose(1, 2)  # [B, H + 2 Hkv, S, hd]
        if self.cfg.qk_norm and self.cfg.qk_norm_span == "head":
            qkv = torch.cat([self.q_norm(qkv[:, :h]), self.k_norm(qkv[:, h : h + hkv]), qkv[:, h + hkv :]], 1)
        # q [B, H, S, hd] rotated; k, v [B, Hkv, S, hd] (no cache) or the cache's visible [B, Hkv, T, hd] after writing
        q, k, v = rot.split(qkv, h) if cache is None else cache.store(layer, qkv, rot, h)
        if isinstance(mask, PLANS):  # a planned forward with a cache (hidden_states: `attention_path` not sdpa)
            y = invariant_attention(q, k, v, mask)  # a query's result never depends on the forward's width
        elif self.cfg.attn_softcap:  # SDPA's place, its scores capped (Gemma 2), which SDPA cannot
            y = capped_attention(q, k, v, mask, causal and mask is None, self.cfg.attn_softcap)
        else:
            if projected.dtype != torch.float32:  # no cache (teacher forcing, training) or a prompt prefill: float32
                q, k, v = q.float(), k.float(), v.float()  # math, as SDPA's bf16 kernels accumulate anyway
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                               enable_gqa=h != hkv).to(projected.dtype)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """float32 0 / -inf [B, 1, S, T] of a bool mask; on a GPU a view into 16-aligned rows, which SDPA's
    memory-efficient kernel would otherwise pad in every layer."""
    t = mask.shape[-1]
    width = -(-t // 16) * 16 if mask.device.type == "cuda" else t
    out = torch.zeros(*mask.shape[:-1], width, dtype=torch.float32, device=mask.device)[..., :t]
    return out.masked_fill_(~mask, float("-inf"))


def split_kv(kv: torch.Tensor, heads: int, hd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused key/value projection [B, M, 2 H hd] -> keys and values [B, H, M, hd]."""
    b, m, _ = kv.shape
    k, v = kv.view(b, m, 2, heads, hd).unbind(2)
    return k.transpose(1, 2), v.transpose(1, 2)


class CrossAttention(nn.Module):
    """Attention from the sequence to a fixed condition (no RoPE, no mask); keys/values computed once per condition."""

    def __init__(self, dim: int, kv_dim: int, n_heads: int, hd: int) -> None:
        super().__init__()
        self.n_heads, self.hd = n_heads, hd
        self.wq = nn.Linear(dim, n_heads * hd, bias=False)
        self.wkv = nn.Linear(kv_dim, 2 * n_heads * hd, bias=False)
        self.wo = nn.Linear(n_heads * hd, dim, bias=False)

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, M, hd] of a condition [B, M, kv_dim]."""
        return split_kv(self.wkv(context), self.n_heads, self.hd)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, kv[0], kv[1])
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); GeGLU (Gemma) with gelu_tanh for silu (`cfg.ffn_act`)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.act = cfg.ffn_act
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w1(x), self.w3(x)  # [..., ffn] each
        if self.act == "silu" and kernel_choice.one_pass(a):  # the fused gate is SwiGLU's only
            return self.w2(torch.ops.specgen.silu_mul(a, b))
        return self.w2(ACTIVATIONS[self.act](a) * b)


class Block(nn.Module):
    """Pre-norm block: self-attention, optional cross-attention, SwiGLU (routed experts: `cfg.n_experts`); with
    `cfg.sandwich_norms` (Gemma) each sublayer's output is normed again before its residual add (attention_out_norm,
    ffn_out_norm; else identities); without `cfg.pre_norms` (OLMo 2) the sublayers read the residual stream unnormed
    (attention_norm, ffn_norm: identities)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        pre_norm = (lambda: RMSNorm(cfg.dim, cfg.norm_eps)) if cfg.pre_norms else nn.Identity  # no parameters
        self.attention_norm = pre_norm()
        self.attention = Attention(cfg)
        if cfg.cross_dim:
            self.cross_norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.cross_attention = CrossAttention(cfg.dim, cfg.cross_dim, cfg.n_heads, cfg.hd)
        self.ffn_norm = pre_norm()
        # routed experts where the config has them (each a FeedForward), else the one dense FeedForward
        self.feed_forward = MoEFeedForward(cfg, FeedForward) if cfg.n_experts else FeedForward(cfg)
        out_norm = (lambda: RMSNorm(cfg.dim, cfg.norm_eps)) if cfg.sandwich_norms else nn.Identity  # no parameters
        self.attention_out_norm, self.ffn_out_norm = out_norm(), out_norm()

    def forward(self, x, rot, layer, cache, mask, causal, cross_kv):
        if kind := native_block.usable(self, x, mask, cross_kv):  # the same kernels without the module calls, bitwise
            return native_block.forward(self, kind, x, rot, layer, cache, mask, cross_kv)
        if deferrable(self.attention.cfg, x, self.ffn_norm):  # each add and the next norm in one pass, bitwise
            x, f = self.deferred(x, None, rot, layer, cache, mask, causal, cross_kv)
            return x + f
        x = x + self.attention_out_norm(self.attention(self.attention_norm(x), rot, layer, cache, mask, causal))
        if cross_kv is not None:
            x = x + self.cross_attention(self.cross_norm(x), cross_kv)
        return x + self.ffn_out_norm(self.feed_forward(self.ffn_norm(x)))

    def deferred(self, x: torch.Tensor, f: torch.Tensor | None, rot, layer: int, cache, mask, causal: bool = False,
                 cross_kv=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` with each residual add inside the next norm's kernel (native norms): the previous block's output
        given as x + f (f None: x), this block's returned as (x, f) unsummed [B, S, dim]; add_rms_norm's sum is the
        add's and its norm the norm's, so the bits are forward's."""
        x, projected = normed_into(x, f, self.attention_norm, self.attention.wqkv)  # [B, S, (H + 2 Hkv) hd]
        a = self.attention.attend(projected, rot, layer, cache, mask, causal)
        if cross_kv is not None:  # the condition's cross-attention between the two, its input's add in its norm
            x, normed = torch.ops.specgen.add_rms_norm(x, a, self.cross_norm.weight, self.cross_norm.eps)
            a = self.cross_attention(normed, cross_kv)
        return normed_into(x, a, self.ffn_norm, self.feed_forward)


def deferrable(cfg: TransformerConfig, x: torch.Tensor, norm: nn.Module) -> bool:
    """Whether a block's residual adds run inside the next norm's kernel (`Block.deferred`; `norm` a block's
    ffn_norm): native norms, pre-norms to run them in (OLMo 2's block has none: identities without a weight), and no
    sandwich norms (whose output norm sits between a sublayer and its add)."""
    return cfg.pre_norms and not cfg.sandwich_norms and native_norms(x, norm.weight)


def normed_into(x: torch.Tensor, f: torch.Tensor | None, norm: RMSNorm, consumer: nn.Module
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + f (f None: x), consumer(norm(x + f))) [B, S, ...] for the module that reads a block's norm (its QKV
    projection, its feed-forward): the native norm's pass (the add inside it), then the consumer."""
    x, normed = (x, norm(x)) if f is None else torch.ops.specgen.add_rms_norm(x, f, norm.weight, norm.eps)
    return x, consumer(normed)


class ClassEmbedding(nn.Module):
    """LlamaGen c2i condition: one embedding row per class plus the null (unconditional) class."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(cfg.num_classes + 1, cfg.dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        """Condition embeddings [B, 1, dim] for labels [B] (label num_classes = null class)."""
        return self.embedding_table(labels).unsqueeze(1)


class CaptionEmbedding(nn.Module):
    """LlamaGen t2i condition: caption features -> cap_proj (fc1, tanh-GELU, fc2; no biases) -> n_cond embeddings;
    `uncond_embedding` [n_cond, caption_dim] (a persistent buffer, as LlamaGen's) is CFG's null caption."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cap_proj = nn.Sequential()
        self.cap_proj.add_module("fc1", nn.Linear(cfg.caption_dim, cfg.dim, bias=False))
        self.cap_proj.add_module("act", nn.GELU(approximate="tanh"))
        self.cap_proj.add_module("fc2", nn.Linear(cfg.dim, cfg.dim, bias=False))
        self.register_buffer("uncond_embedding", torch.randn(cfg.n_cond, cfg.caption_dim) / cfg.caption_dim**0.5)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        """Condition embeddings [B, n_cond, dim] for caption features [B, n_cond, caption_dim]."""
        return self.cap_proj(captions.to(self.cap_proj.fc1.weight.dtype))


CONDITION_EMBEDDINGS = {"class": ClassEmbedding, "caption": CaptionEmbedding}  # cond_kind -> its `cls_embedding`


def padded_causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """LlamaGen's masked causal mask [B, S, S] over S slots, some of them padding (valid [B, S] marks real slots):
    query i sees key j iff j <= i and (slot j is not padding or j == i)."""
    s = valid.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(s, dtype=torch.bool, device=valid.device)
    return causal & (valid[:, None, :] | eye)


def rope_table(cfg: TransformerConfig, local: bool = False) -> torch.Tensor:
    """The model's RoPE table as each position's Rotation rows [P, 2, hd] (float32, `rope.layout_table`): 1D over
    max_seq_len, or LlamaGen 2D; `local`: the local layers' (Gemma's sliding layers: their own base, unscaled). Made on
    the CPU even in a meta build, whose first meta op would import torch's Python decompositions (seconds at every
    start)."""
    with torch.device("cpu"):
        if cfg.rope_grid:
            pairs = table_2d(cfg.rope_grid, cfg.hd, cfg.rope_theta, cfg.n_cond)
        elif local:
            pairs = table_1d(cfg.max_seq_len, cfg.hd, cfg.local_rope_theta, None, cfg.rotary_dim)
        else:
            pairs = table_1d(cfg.max_seq_len, cfg.hd, cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim)
        return layout_table(pairs, cfg.rope_layout)


class Transformer(nn.Module):
    """Token embeddings -> blocks -> norm -> LM head; also returns the final hidden states."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.cond_kind in CONDITION_EMBEDDINGS:
            self.cls_embedding = CONDITION_EMBEDDINGS[cfg.cond_kind](cfg)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope_table", rope_table(cfg), persistent=False)  # [P, 2, hd]
        if cfg.embed_scale != 1:  # float32 [] (`embed`), as transformers' buffer; on the CPU in a meta build too
            self.register_buffer("embed_scale", torch.tensor(float(cfg.embed_scale), device="cpu"), persistent=False)
        if cfg.local_rope_theta:  # [P, 2, hd]: the local layers' (`layer_rotations`)
            self.register_buffer("local_rope_table", rope_table(cfg, local=True), persistent=False)
        self.graphs = None  # models/graphs.StepGraphs: cached forwards as CUDA-graph replays (graphs.attach)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the final norm's (a quantized model has no float embedding or head weight)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The input embeddings [B, S, dim] of tokens [B, S]: the table's rows times `cfg.embed_scale` (Gemma's
        sqrt(dim)) rounded to their dtype first, as transformers scales them."""
        h = self.tok_embeddings(tokens)
        return h if self.cfg.embed_scale == 1 else h * self.embed_scale.to(h.dtype)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """A cache for this model in its activation dtype (with captured steps: a view of their static cache)."""
        return new_cache(self, self.cfg.n_layers, batch, max_len, self.dtype, self.device)

    def context_kv(self, context: torch.Tensor) -> list:
        """Per-layer cross-attention keys/values of a condition [B, M, cross_dim]."""
        return [blk.cross_attention.context_kv(context) for blk in self.layers]

    def forward(
        self,
        tokens: torch.Tensor | list | None,  # [B, S] token ids (nested lists: built on the host, Target.forward)
        positions: torch.Tensor | list,  # [B, S] position ids (index the RoPE table)
        cache: KVCache | None = None,
        tree_mask: torch.Tensor | None = None,  # [S, S] or [B, S, S] bool among the new nodes
        embeds: torch.Tensor | None = None,  # [B, S, dim] instead of tokens (condition tokens)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, S, V] and final hidden states [B, S, dim] (after the final norm) of S new nodes per row: with a
        cache they attend to the row's committed slots plus the pending nodes `tree_mask` allows (causal when None)
        and are written as pending slots (`models/cache.py`); without one the S tokens are the whole sequence."""
        if self.graphs is not None and cache is not None and embeds is None:
            replayed = self.graphs.forward(tokens, positions, cache, tree_mask)  # None: this call runs eagerly
            if replayed is not None:
                return replayed  # (logits, hidden)
        return self.eager(tokens, positions, cache, tree_mask, embeds)

    def eager(self, tokens, positions, cache=None, tree_mask=None, embeds=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` run eagerly, its captured steps not asked (e.g. they just declined this call)."""
        if isinstance(positions, list):  # built on the host (a verify's, an AR step's), as captured steps stage them
            tokens, positions, tree_mask = host_inputs(tokens, positions, tree_mask, self.device)
        h = self.embed(tokens) if embeds is None else embeds
        hidden = self.hidden_states(h, positions, cache, tree_mask)
        return self.logits(hidden), hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits [..., V] of final hidden states [..., dim]: divided by `cfg.logit_scale` (Granite's
        logits_scaling), then with `cfg.logit_softcap` (Gemma 2) cap tanh(z / cap) of each, in the head's dtype as
        transformers computes them."""
        z = self.output(hidden)
        if self.cfg.logit_scale != 1:  # a Python float: one rounding to the head's dtype, as transformers' division
            z = z / self.cfg.logit_scale
        cap = self.cfg.logit_softcap
        return z if not cap else row_invariant(torch.tanh, z / cap) * cap

    def hidden_states(self, h, positions, cache=None, tree_mask=None, context_kv=None, attn_mask=None) -> torch.Tensor:
        """Run the blocks on input embeddings h [B, S, dim]; returns normed hidden [B, S, dim]. `attn_mask`
        [B, 1, S, T] exposes pending slots of earlier forwards (multi-level trees) instead of the cache's mask."""
        rots = layer_rotations(self, forward_rotation(self, positions, h.dtype), positions)
        masks, causal = layer_masks(self.cfg, h, positions, cache, tree_mask, attn_mask)
        cross = context_kv if cache is None else cache.cross
        for i, blk in enumerate(self.layers):
            h = blk(h, rots[i], i, cache, masks[i], causal, None if cross is None else cross[i])
        return self.norm(h)


def new_cache(module, n_layers: int, batch: int, max_len: int | None, dtype: torch.dtype, device) -> KVCache:
    """A KVCache of `module` (a Transformer or EAGLE drafter) on its device; a view of its captured steps' static
    cache when it has them."""
    if module.graphs is not None:
        return module.graphs.new_cache(batch, max_len or module.cfg.max_seq_len)
    cfg = module.cfg
    return KVCache.allocate(n_layers, batch, cfg.n_kv_heads, max_len or cfg.max_seq_len, cfg.hd, dtype, device)


def forward_rotation(module, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
    """The RoPE rows of `positions` [B, S] in the activation dtype (as HF casts cos/sin), made once for every layer.
    A position past the table: a ContextOverflowError on the CPU, a queued device assert on a GPU (no host wait per
    forward; decode paths refuse a sequence that cannot fit before they start)."""
    limit = module.rope_table.shape[0]
    if positions.device.type != "cpu":
        torch._assert_async(positions.max() < limit, f"a position is past the RoPE table's {limit}")
    elif (top := int(positions.max())) >= limit:
        raise ContextOverflowError(top, limit)
    return rows_rotation(module.rope_table[positions].to(dtype), module.cfg.rope_layout)


def layer_rotations(module, rot: Rotation, positions: torch.Tensor) -> list[Rotation]:
    """Each layer of `module` (a Transformer or EAGLE drafter): the forward's `rot` (the table's rows at `positions`
    [B, S], in range: `forward_rotation`), at a NoPE layer (`cfg.nope_layers`) one that turns nothing (`rope.still`:
    the RoPE layers' kernels, every value kept bit for bit), at a local layer (`cfg.local_layers`, Gemma's sliding
    ones) the local table's rows at the same positions (the same kernels, another base)."""
    cfg = module.cfg
    kept = still(rot) if cfg.nope_layers else rot
    if not cfg.local_rope_theta:  # local layers (if any) only slide: the forward's rotation, NoPE ones still
        return [kept if i in cfg.nope_layers else rot for i in range(cfg.n_layers)]
    local = rows_rotation(module.local_rope_table[positions].to(rot.cos.dtype), cfg.rope_layout)
    return [kept if i in cfg.nope_layers else local if i in cfg.local_layers else rot for i in range(cfg.n_layers)]


def forward_mask(cfg: TransformerConfig, h: torch.Tensor, cache: KVCache | None, tree_mask, attn_mask) -> tuple:
    """(what every full-attention block of a forward over h [B, S, dim] attends with, causal): over a cache, an
    attention plan where `attention_path` is not sdpa (batch/width-invariant, models/attention.py) or SDPA's additive
    mask (made once per forward, not per layer); without one, the tree mask among the S tokens or causal."""
    s = h.shape[1]
    if cache is None:
        return (None, True) if tree_mask is None else (tree_mask.view(-1, 1, s, s), False)
    cache.check_room(s)
    return attending(cfg, h, cache, slot_mask(cache, s, tree_mask, attn_mask)), False


def slot_mask(cache: KVCache, s: int, tree_mask, attn_mask) -> torch.Tensor | None:
    """The forward's visible slots [B, 1, S, T] bool over the cache (None: all): `attn_mask` with the cache's hidden
    keys hidden, else the committed prefix and `tree_mask` among the S new nodes (cache.prefix_mask)."""
    return cache.hide_keys(attn_mask) if attn_mask is not None else cache.prefix_mask(s, tree_mask)


def attending(cfg: TransformerConfig, h: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
              start: torch.Tensor | None = None):
    """What blocks attend with over the cache given the visible slots `mask` [B, 1, S, T] (None: all): the plan
    (`attention.plan`; `start` [B, S]: a windowed mask's first visible positions) or SDPA's additive mask."""
    b, s = h.shape[:2]
    if attention_path(h.dtype, h.device, cfg.attn_softcap) != "sdpa":
        t = mask.shape[-1] if mask is not None else max(cache.lengths) + s
        return plan(mask, b, s, t, cfg.n_heads, cfg.n_kv_heads, cfg.hd, h.device, h.dtype, cache.lengths, start,
                    cfg.attn_softcap)
    return None if mask is None else additive_mask(mask)


def layer_masks(cfg: TransformerConfig, h: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, tree_mask,
                attn_mask) -> tuple[list, bool]:
    """(each layer's mask or plan, causal): `forward_mask`'s for full-attention layers and, with a window, one more
    for the local (sliding) layers: both made once per forward from one visibility, each layer handed its own (as
    `layer_rotations`)."""
    if not cfg.window:
        full, causal = forward_mask(cfg, h, cache, tree_mask, attn_mask)
        return [full] * cfg.n_layers, causal
    full, local = windowed_masks(cfg, h, positions, cache, tree_mask, attn_mask)
    return [local if i in cfg.local_layers else full for i in range(cfg.n_layers)], False


def windowed_masks(cfg: TransformerConfig, h: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, tree_mask,
                   attn_mask) -> tuple:
    """(the full layers', the local layers') masks of a windowed model's forward: the visible keys, and those also
    in the window by token positions (a query at position p sees keys at p - window + 1 .. p), never by slots (a
    tree's nodes share positions). Without a cache: bool masks [B, 1, S, S] among the S tokens (positions [B, S]),
    the causal one explicit (SDPA's is_causal is per forward); over one, `attending`'s plans."""
    s = h.shape[1]
    if cache is None:
        seen = torch.ones(s, s, dtype=torch.bool, device=h.device).tril() if tree_mask is None else tree_mask
        seen = seen.view(-1, 1, s, s)
        return seen, seen & in_window(positions, positions, cfg.window)
    if attn_mask is not None or cache.key_mask is not None:  # a key's position is its slot's only in a text cache
        raise ValueError("a sliding window over earlier forwards' pending slots or hidden keys is not implemented")
    cache.check_room(s)
    seen = slot_mask(cache, s, tree_mask, None)  # [B, 1, S, T] (None: all)
    t = max(cache.lengths) + s
    near = in_window(positions, key_positions(host_tensor(cache.lengths, h.device), positions, t), cfg.window)
    local = near if seen is None else seen & near  # [B, 1, S, T]
    return (attending(cfg, h, cache, seen),
            attending(cfg, h, cache, local, (positions - (cfg.window - 1)).clamp_(min=0)))
