"""A transformers causal LM (Llama, Mistral, Qwen2, Qwen3, Phi-3, SmolLM3, Gemma, Gemma 2, Gemma 3, OLMo 2, OLMo 3,
EXAONE 4, Granite, Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) of a specgen Transformer's weights (the `hf` row)."""

from __future__ import annotations

import re

import torch

from specgen.models.llama import FUSED, layer_map
from specgen.models.rope import per_head, scaled_inv_freq, spread_order
from specgen.models.transformer import Transformer


def interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q/k projection rows from Meta's interleaved rotary pairs to HF's rotate_half halves."""
    hd = w.shape[0] // n_heads  # w [rows, cols] or [rows] (a norm weight)
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The state under HF Llama/Qwen2/Qwen3 names (`llama.layer_map`, the loader's), in the rotate_half layout; with
    partial RoPE under Phi-3's fused names (the class `to_hf` builds), q/k rows in transformers' order again; with a
    Gemma block (`gemma_block`) each norm as the offset w its 1 + w multiplies by (the loader's fold undone; Gemma 3's
    attention scale stays in q's norm, Gemma 2's in q's projection, exported with query_pre_attn_scalar = head size),
    Gemma 2's and 3's sandwich norms under their names (OLMo 2's too)."""
    cfg, sd = model.cfg, model.state_dict()
    sizes = [cfg.n_heads * cfg.hd] + [cfg.n_kv_heads * cfg.hd] * 2
    out = {}
    for ours, theirs in layer_map(cfg, "hf").items():
        for name, t in zip(theirs, sd[ours].split(sizes) if len(theirs) == 3 else (sd[ours],)):
            qk = re.search(r"self_attn\.([qk])_(proj|norm)\.", name)
            if qk and cfg.rope_layout == "interleaved":  # q/k rows and their norm weights follow the rotary pairs
                t = interleaved_to_half(t, t.shape[0] // cfg.hd)  # the heads they span (a per-head norm: 1)
            if qk and cfg.rope_dim:  # partial RoPE: transformers' order of a head's dims
                t = per_head(t, spread_order(cfg.hd, cfg.rope_dim).argsort())
            out[name] = t
    if cfg.qk_norm and cfg.qkv_bias:  # Qwen3's attention_bias also biases o_proj: zero, as specgen has none
        out |= {f"model.layers.{i}.self_attn.o_proj.bias": sd["norm.weight"].new_zeros(cfg.dim)
                for i in range(cfg.n_layers)}
    if gemma_block(cfg):
        out = {name: t - 1 if name.endswith("norm.weight") else t for name, t in out.items()}
    out = stacked_experts(out, cfg) if cfg.n_experts else out
    return fused(out, "Phi3ForCausalLM") if cfg.rope_dim else out


def stacked_experts(state: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Per-expert HF tensors (`llama.EXPERT_NAMES`) as transformers 5's live MoE parameters: each layer's
    `mlp.experts.gate_up_proj` [E, 2 I, dim] (an expert's gate rows, then its up rows) and `down_proj` [E, dim, I]."""
    out = dict(state)
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}.mlp.experts."
        take = lambda e, part: out.pop(f"{pre}{e}.{part}_proj.weight")  # noqa: E731
        out[pre + "gate_up_proj"] = torch.stack([torch.cat([take(e, "gate"), take(e, "up")])
                                                 for e in range(cfg.n_experts)])  # [E, 2 I, dim]
        out[pre + "down_proj"] = torch.stack([take(e, "down") for e in range(cfg.n_experts)])  # [E, dim, I]
    return out


def built(family: str, config_class: str = "", **config):
    """transformers' `{family}ForCausalLM` of its `{family}Config` (or `config_class`) holding `config`: an optional
    dependency, which only an export needs (the `hf` rows)."""
    import transformers  # optional dependency: imported where an export runs, not where specgen loads

    return getattr(transformers, f"{family}ForCausalLM")(getattr(transformers, config_class or f"{family}Config")(
        **config))


def moe(cfg, common: dict):
    """transformers' class of a routed config (`moe_kind`: Qwen2MoeForCausalLM, OlmoeForCausalLM, Qwen3MoeForCausalLM
    or MixtralForCausalLM), every layer routed. A config none can express is a ValueError. (Exports are float32, where
    rounding the weights before they scale changes no bit.)"""
    if (cfg.sandwich_norms or not cfg.pre_norms or cfg.ffn_act != "silu" or cfg.embed_scale != 1 or cfg.nope_layers
            or cfg.rope_dim or cfg.local_rope_theta or cfg.attn_softcap or cfg.logit_softcap or cfg.logit_scale != 1
            or cfg.rope_layout != "half" or (cfg.rope_scaling or {}).get("rope_type") == "factors"
            or not MOE_KINDS[moe_kind(cfg)][0](cfg)):
        raise ValueError("to_hf exports routed experts as Mixtral (the k weights renormalised), Qwen2-MoE (a shared "
                         "expert, q/k/v biases or none), Qwen3-MoE (per-head q/k norms) or OLMoE (q/k norms over whole "
                         "projections, no window): Llama's block, a SwiGLU gate, no scales, caps, other biases, NoPE "
                         "layers or partial RoPE, whole-head rotate-half RoPE")
    name, keys = MOE_KINDS[moe_kind(cfg)][1:]
    return built(name.removesuffix("ForCausalLM"), **common, num_experts_per_tok=cfg.experts_per_token,
                 pad_token_id=None, bos_token_id=None, eos_token_id=None, **keys(cfg))


def moe_kind(cfg) -> str:
    """Which routed block a config is: a shared expert's (Qwen2-MoE), q/k norms over whole projections (OLMoE) or per
    head (Qwen3-MoE), or neither (Mixtral)."""
    if cfg.shared_expert_dim:
        return "qwen2_moe"
    return {"all": "olmoe", "head": "qwen3_moe"}[cfg.qk_norm_span] if cfg.qk_norm else "mixtral"


def routed_keys(cfg) -> dict:
    """The keys the Qwen MoE and OLMoE configs share: E experts, norm_topk_prob, every layer routed."""
    return dict(num_experts=cfg.n_experts, norm_topk_prob=cfg.expert_renorm)


#: moe_kind -> (whether transformers' class expresses the config's routed block beyond the checks every kind shares,
#: the class, its config keys beyond `common`'s)
MOE_KINDS = {
    "qwen2_moe": (lambda cfg: not cfg.qk_norm, "Qwen2MoeForCausalLM", lambda cfg: dict(
        routed_keys(cfg), moe_intermediate_size=cfg.ffn_dim, shared_expert_intermediate_size=cfg.shared_expert_dim,
        qkv_bias=cfg.qkv_bias, decoder_sparse_step=1, mlp_only_layers=[], **sliding(cfg))),
    # (its q/k norms span hidden_size and the heads' hidden_size / heads: a head of another size cannot be expressed)
    "olmoe": (lambda cfg: not (cfg.qkv_bias or cfg.window) and cfg.hd * cfg.n_heads == cfg.dim, "OlmoeForCausalLM",
              lambda cfg: dict(routed_keys(cfg), attention_bias=False, clip_qkv=None)),
    "qwen3_moe": (lambda cfg: not cfg.qkv_bias, "Qwen3MoeForCausalLM", lambda cfg: dict(
        routed_keys(cfg), moe_intermediate_size=cfg.ffn_dim, use_sliding_window=bool(cfg.window),
        attention_bias=False, decoder_sparse_step=1, mlp_only_layers=[], **sliding(cfg, every=True))),
    "mixtral": (lambda cfg: cfg.expert_renorm and not cfg.qkv_bias, "MixtralForCausalLM",
                lambda cfg: dict(num_local_experts=cfg.n_experts, **sliding(cfg, every=True))),
}


def gemma_block(cfg) -> bool:
    """Whether `to_hf` exports the config as a Gemma (1 or 3): its gate, embedding scale or local RoPE are theirs; its
    block has pre-norms (OLMo 2's sandwich norms without them: `olmo2`) and is not Llama's with scales
    (`granite_block`)."""
    return cfg.pre_norms and not granite_block(cfg) and (cfg.sandwich_norms or cfg.ffn_act != "silu"
                                                         or cfg.embed_scale != 1 or bool(cfg.local_rope_theta))


def granite_block(cfg) -> bool:
    """Whether `to_hf` exports the config as Granite: Llama's block (pre-norms only, SwiGLU, one RoPE base) with an
    embedding scale or a logit divisor (a Gemma 1's sqrt(dim) scale comes with its GeGLU gate)."""
    return (cfg.pre_norms and not cfg.sandwich_norms and cfg.ffn_act == "silu" and not cfg.local_rope_theta
            and (cfg.embed_scale != 1 or cfg.logit_scale != 1))


def granite(cfg, common: dict):
    """transformers' GraniteForCausalLM of Llama's block with `cfg.embed_scale` as embedding_multiplier and
    `cfg.logit_scale` as logits_scaling; its attention and residual multipliers are in the weights (the loader's fold,
    kept), so exported as the kernels' 1/sqrt(head_dim) and 1. A config Granite cannot express is a ValueError."""
    if (cfg.qk_norm or cfg.qkv_bias or cfg.window or cfg.nope_layers or cfg.rope_dim or cfg.attn_softcap
            or cfg.logit_softcap):
        raise ValueError("to_hf exports an embedding scale or logit divisor with a SwiGLU gate as Granite, whose "
                         "block has no q/k norms or q/k/v-only biases, window, NoPE layers, partial RoPE or caps")
    return built(
        "Granite", **common, embedding_multiplier=cfg.embed_scale, logits_scaling=cfg.logit_scale,
        attention_multiplier=cfg.hd**-0.5, residual_multiplier=1.0, attention_bias=False, mlp_bias=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None)


def post_norm_block(cfg) -> bool:
    """Whether a block without pre-norms is what OLMo 2's, OLMo 3's and EXAONE 4's classes share: sandwich norms
    (the config's invariant), a SwiGLU gate, no embedding scale, caps or q/k/v biases, whole-head rotate-half RoPE."""
    return cfg.ffn_act == "silu" and not (cfg.embed_scale != 1 or cfg.rope_dim or cfg.qkv_bias or cfg.attn_softcap
                                          or cfg.logit_softcap or cfg.rope_layout != "half")


def olmo(cfg, common: dict):
    """transformers' Olmo2ForCausalLM of a block without pre-norms (`cfg.pre_norms` false) whose q and k are normed
    over their whole projections: sandwich norms, SwiGLU; with local layers Olmo3ForCausalLM (`olmo3`). A config
    neither can express is a ValueError."""
    if not (cfg.qk_norm and cfg.qk_norm_span == "all" and post_norm_block(cfg)) or cfg.nope_layers:
        raise ValueError("to_hf exports a block without pre-norms as OLMo 2 or 3, whose block has q/k norms over "
                         "their whole projections, a SwiGLU gate, no embedding scale, NoPE layers, caps or q/k/v "
                         "biases and whole-head rotate-half RoPE in every layer")
    if cfg.local_layers:
        return olmo3(cfg, common)
    return built("Olmo2", **common, attention_bias=False, pad_token_id=None, bos_token_id=None,
                 eos_token_id=None)


def olmo3(cfg, common: dict):
    """transformers' Olmo3ForCausalLM of an OLMo 2 block with local layers: those sliding, with specgen's window
    (none: the context, which makes them attend fully as specgen's do), turning with their own unscaled base (none:
    the full layers', which then must be unscaled), the full layers with the config's base and scaling."""
    if (not cfg.local_rope_theta and cfg.rope_scaling) or (cfg.rope_scaling or {}).get("rope_type") == "factors":
        raise ValueError("to_hf exports local layers as OLMo 3's sliding ones, which turn with an unscaled RoPE, the "
                         "full ones with a scaling of transformers' (not a GGUF's frequency divisors)")
    full = {"rope_type": "default", **common.pop("rope_scaling", {}), "rope_theta": common.pop("rope_theta")}
    local = {"rope_type": "default", "rope_theta": cfg.local_rope_theta or full["rope_theta"]}
    return built(
        "Olmo3", **common, rope_parameters={"full_attention": full, "sliding_attention": local},
        layer_types=layer_types(cfg), sliding_window=cfg.window or cfg.max_seq_len, attention_bias=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None)


def exaone4(cfg, common: dict):
    """transformers' Exaone4ForCausalLM of a block without pre-norms whose q and k are normed per head: its local
    layers sliding over specgen's window (none: the context) and the others NoPE, or, without NoPE or local layers,
    every layer full with RoPE (its class's null window). A config EXAONE 4 cannot express is a ValueError."""
    full = tuple(i for i in range(cfg.n_layers) if i not in cfg.local_layers)
    windowed = bool(cfg.nope_layers or cfg.local_layers)
    if not (cfg.qk_norm and post_norm_block(cfg)) or cfg.local_rope_theta or (windowed and cfg.nope_layers != full):
        raise ValueError("to_hf exports a block without pre-norms and per-head q/k norms as EXAONE 4, whose block has "
                         "a SwiGLU gate, no embedding scale, caps or q/k/v biases, one RoPE base, whole-head "
                         "rotate-half RoPE, and either every layer full with RoPE or the layers that do not slide NoPE")
    return built(
        "Exaone4", **common, layer_types=layer_types(cfg),
        sliding_window=(cfg.window or cfg.max_seq_len) if windowed else None, pad_token_id=None, bos_token_id=None,
        eos_token_id=None)


def gemma(cfg, common: dict):
    """transformers' GemmaForCausalLM (Gemma 1) of a Gemma block without sandwich norms. A config Gemma 1 cannot
    express is a ValueError."""
    if not (cfg.ffn_act == "gelu_tanh" and cfg.embed_scale == cfg.dim**0.5) or (
            cfg.qk_norm or cfg.window or cfg.local_rope_theta or cfg.nope_layers or cfg.rope_dim or cfg.qkv_bias
            or cfg.rope_layout != "half" or (cfg.rope_scaling or {}).get("rope_type") == "factors"):
        raise ValueError("to_hf exports a Gemma block without sandwich norms as Gemma 1, whose block has a gelu_tanh "
                         "gate, a sqrt(dim) embedding scale, whole-head rotate-half RoPE in every layer, no window and "
                         "no q/k norms or biases")
    return built("Gemma", **common, hidden_act="gelu_pytorch_tanh", attention_bias=False,
                 pad_token_id=None, bos_token_id=None, eos_token_id=None)


def caps(cfg) -> dict:
    """transformers' Gemma 2/3 softcapping keys of a config's caps (null: none, where specgen's field is 0), and the
    eager attention that applies the score cap (transformers' SDPA refuses one)."""
    out = {"attn_logit_softcapping": cfg.attn_softcap or None, "final_logit_softcapping": cfg.logit_softcap or None}
    return out | ({"attn_implementation": "eager"} if cfg.attn_softcap else {})


def gemma2(cfg, common: dict):
    """transformers' Gemma2ForCausalLM of a Gemma-block config with sandwich norms and no q/k norms: its local layers
    as sliding ones, with specgen's window (none: the context, which makes them attend fully as specgen's do), one
    RoPE base for every layer, the caps; query_pre_attn_scalar the head size, whose scale the kernels apply (the
    checkpoint's own is in q's projection). A config Gemma 2 cannot express is a ValueError."""
    if not (cfg.ffn_act == "gelu_tanh" and cfg.embed_scale == cfg.dim**0.5) or (
            cfg.local_rope_theta or cfg.nope_layers or cfg.rope_dim or cfg.qkv_bias or cfg.rope_layout != "half"
            or (cfg.rope_scaling or {}).get("rope_type") == "factors"):
        raise ValueError("to_hf exports sandwich norms without q/k norms as Gemma 2, whose block has a gelu_tanh gate, "
                         "a sqrt(dim) embedding scale, one RoPE base and whole-head rotate-half RoPE in every layer "
                         "and no q/k/v biases")
    return built(
        "Gemma2", **common, layer_types=layer_types(cfg), sliding_window=cfg.window or cfg.max_seq_len,
        query_pre_attn_scalar=cfg.hd, hidden_activation="gelu_pytorch_tanh", attention_bias=False, pad_token_id=None,
        bos_token_id=None, eos_token_id=None, **caps(cfg))


def gemma3(cfg, common: dict):
    """transformers' Gemma3ForCausalLM of a Gemma-block config (sandwich norms): its local layers as sliding ones,
    with specgen's window (none: the context, which makes them attend fully as specgen's do); query_pre_attn_scalar
    the head size, whose scale the kernels apply (the checkpoint's own is in q's norm). A config Gemma 3 cannot
    express is a ValueError (a tied export loads non-strictly and would drop weights silently)."""
    if not (cfg.qk_norm and cfg.ffn_act == "gelu_tanh" and cfg.embed_scale == cfg.dim**0.5) or cfg.attn_softcap or (
            cfg.nope_layers or cfg.rope_dim or cfg.qkv_bias or cfg.rope_layout != "half"
            or (cfg.rope_scaling or {}).get("rope_type") == "factors"):
        raise ValueError("to_hf exports sandwich norms as Gemma 3, whose block has q/k norms, a gelu_tanh gate, a "
                         "sqrt(dim) embedding scale, whole-head rotate-half RoPE in every layer, no q/k/v biases and "
                         "no attention cap (its class ignores one)")
    return built(
        "Gemma3", "Gemma3TextConfig", **common, rope_local_base_freq=cfg.local_rope_theta or 10000.0,
        layer_types=layer_types(cfg), sliding_window=cfg.window or cfg.max_seq_len, query_pre_attn_scalar=cfg.hd,
        hidden_activation="gelu_pytorch_tanh", attention_bias=False, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, **caps(cfg))


def sliding(cfg, every: bool = False) -> dict:
    """A windowed config's sliding layers as transformers' classes read them (`layer_types`, the window and the
    switch Qwen's and SmolLM3's classes need); `every`: a class whose window slides every layer (Mistral, Phi-3),
    which refuses another split. {} without a window."""
    if not cfg.window:
        return {}
    if every:
        if cfg.local_layers != tuple(range(cfg.n_layers)):
            raise ValueError("to_hf exports this block's sliding window as a class whose window slides every layer")
        return {"sliding_window": cfg.window}
    return {"sliding_window": cfg.window, "use_sliding_window": True, "layer_types": layer_types(cfg)}


def layer_types(cfg) -> list[str]:
    """transformers' `layer_types` of a config: its local layers sliding, the others full."""
    return ["sliding_attention" if i in cfg.local_layers else "full_attention" for i in range(cfg.n_layers)]


def fused(state: dict[str, torch.Tensor], arch: str) -> dict[str, torch.Tensor]:
    """Llama-named tensors as `arch`'s fused ones (`llama.FUSED`, whose parts are in order along dim 0)."""
    out, parts = dict(state), {}
    for name in state:
        for ours, (whole, part) in FUSED[arch].items():
            if name.endswith(ours):
                parts.setdefault(name.removesuffix(ours) + whole, {})[part] = out.pop(name)
    return out | {whole: torch.cat([p[i] for i in sorted(p)]) for whole, p in parts.items()}


def smollm3(cfg, common: dict):
    """SmolLM3: Llama's math, a 0 in `no_rope_layers` for each layer without RoPE."""
    return built(
        "SmolLM3", **common, no_rope_layers=[int(i not in cfg.nope_layers) for i in range(cfg.n_layers)],
        attention_bias=False, mlp_bias=False, pad_token_id=None, bos_token_id=None, eos_token_id=None, **sliding(cfg))


def phi3(cfg, common: dict):
    """Partial RoPE: transformers reads `partial_rotary_factor` in Phi-3's classes."""
    original = (cfg.rope_scaling or {}).get("original_max_position_embeddings", cfg.max_seq_len)
    return built("Phi3", **common, partial_rotary_factor=cfg.rope_dim / cfg.hd, pad_token_id=None,
                 original_max_position_embeddings=original, **sliding(cfg, every=True))


def qwen3(cfg, common: dict):
    """Per-head q/k norms (q/k/v biases optional)."""
    return built("Qwen3", **common, attention_bias=cfg.qkv_bias, **sliding(cfg))


def qwen2(cfg, common: dict):
    """q/k/v biases without q/k norms."""
    return built("Qwen2", **common, **sliding(cfg))


def mistral(cfg, common: dict):
    """Llama's math with every layer sliding."""
    return built("Mistral", **common, **sliding(cfg, every=True))


def llama(cfg, common: dict):
    return built("Llama", **common, attention_bias=False, mlp_bias=False)


#: (test, builder) per transformers family, the first whose test a config passes builds its model: a later test
#: holds only where the earlier ones failed (Qwen 2: q/k/v biases and no q/k norms; Llama: none of them)
FAMILIES = (
    (lambda c: c.n_experts, moe),
    (lambda c: not c.pre_norms and c.qk_norm_span == "all", olmo),  # q/k norms over whole projections
    (lambda c: not c.pre_norms, exaone4),  # per head, or none
    (granite_block, granite),
    (lambda c: c.sandwich_norms and c.qk_norm, gemma3),
    (lambda c: c.sandwich_norms, gemma2),
    (gemma_block, gemma),
    (lambda c: c.nope_layers, smollm3),
    (lambda c: c.rope_dim, phi3),
    (lambda c: c.qk_norm, qwen3),
    (lambda c: c.qkv_bias, qwen2),
    (lambda c: c.window, mistral),
    (lambda c: True, llama),
)


def to_hf(model: Transformer):
    """A transformers causal LM with identical weights (float32, eval mode)."""
    cfg = model.cfg
    if cfg.rope_grid or cfg.cross_dim or cfg.cond_kind != "none":
        raise ValueError("to_hf exports text Transformers (1D RoPE, no cross-attention or condition embedding)")
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.hd, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                  max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=cfg.tie_embeddings)
    factors = cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "factors"  # no type of transformers'
    if cfg.rope_scaling and not factors:  # transformers 4.x reads `rope_scaling`; 5.x moves it into rope_parameters
        common["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.rope_scaling and cfg.rope_scaling["rope_type"] == "longrope":
        # no extension: max_seq_len is at most the original context (llama.capped_context), so the short factors hold
        # throughout; the factor only stands in for the attention factor, which is given. Left out, transformers
        # derives it from original_max_position_embeddings and prints advice to set it (the `hf` row's noise)
        common["rope_scaling"]["factor"] = 1.0
    if cfg.nope_layers and cfg.pre_norms and (cfg.rope_dim or cfg.qk_norm or cfg.qkv_bias):  # (no loader builds one)
        raise ValueError("to_hf exports NoPE layers as SmolLM3, which has no partial RoPE, q/k norms or q/k/v-only "
                         "biases, or as EXAONE 4, whose block has no pre-norms")
    if (cfg.attn_softcap or cfg.logit_softcap) and not cfg.sandwich_norms:  # only Gemma 2's and 3's classes cap
        raise ValueError("to_hf exports softcaps as Gemma 2 or Gemma 3, whose blocks have sandwich norms")
    if cfg.qk_norm_span != "head" and cfg.pre_norms and not cfg.n_experts:  # (no loader builds one; OLMoE's routes)
        raise ValueError("to_hf exports q/k norms over whole projections as OLMo 2, whose block has no pre-norms")
    if cfg.logit_scale != 1 and not granite_block(cfg):  # only Granite's class divides the logits
        raise ValueError("to_hf exports a logit divisor as Granite, whose block is Llama's (pre-norms only, SwiGLU)")
    hf = next(build for test, build in FAMILIES if test(cfg))(cfg, common)
    hf.load_state_dict(hf_state(model), strict=not cfg.tie_embeddings)
    if cfg.tie_embeddings:
        hf.tie_weights()
    if factors:  # a GGUF's frequency divisors: the default RoPE with specgen's frequencies in its buffers
        freq, _ = scaled_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
        with torch.no_grad():
            hf.model.rotary_emb.inv_freq.copy_(freq)
            hf.model.rotary_emb.original_inv_freq.copy_(freq)
    return hf.float().eval()
