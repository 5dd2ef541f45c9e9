"""A `transformers` Llama / Qwen2 / Qwen3 causal LM with the same weights as a specgen Transformer (the `hf`
benchmark row, and tests that specgen's logits equal transformers')."""

from __future__ import annotations

import torch

from specgen.models.transformer import Transformer


def interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q/k projection rows from Meta's interleaved rotary pairs to HF's rotate_half halves."""
    rows, cols = w.shape[0], w.shape[1:] if w.dim() > 1 else ()
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, *cols).transpose(1, 2).reshape(rows, *cols)


def hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    """specgen parameter names -> HF Llama/Qwen2 names, in the rotate_half layout."""
    cfg, sd = model.cfg, model.state_dict()
    q_dim, kv_dim = cfg.n_heads * cfg.hd, cfg.n_kv_heads * cfg.hd
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"],
           "lm_head.weight": sd["output.weight"]}
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            q, k, v = sd[p + f"attention.wqkv.{kind}"].split([q_dim, kv_dim, kv_dim])
            if cfg.rope_layout == "interleaved":
                q, k = interleaved_to_half(q, cfg.n_heads), interleaved_to_half(k, cfg.n_kv_heads)
            out |= {h + f"self_attn.q_proj.{kind}": q, h + f"self_attn.k_proj.{kind}": k, h + f"self_attn.v_proj.{kind}": v}
        if cfg.qk_norm:
            q_norm, k_norm = sd[p + "attention.q_norm.weight"], sd[p + "attention.k_norm.weight"]
            if cfg.rope_layout == "interleaved":  # the norm weight follows its rows
                q_norm, k_norm = interleaved_to_half(q_norm, 1), interleaved_to_half(k_norm, 1)
            out |= {h + "self_attn.q_norm.weight": q_norm, h + "self_attn.k_norm.weight": k_norm}
            if cfg.qkv_bias:  # Qwen3's attention_bias also biases o_proj: zero, as specgen has none
                out[h + "self_attn.o_proj.bias"] = sd[p + "attention.wo.weight"].new_zeros(cfg.dim)
        out |= {h + "self_attn.o_proj.weight": sd[p + "attention.wo.weight"],
                h + "mlp.gate_proj.weight": sd[p + "feed_forward.w1.weight"],
                h + "mlp.up_proj.weight": sd[p + "feed_forward.w3.weight"],
                h + "mlp.down_proj.weight": sd[p + "feed_forward.w2.weight"],
                h + "input_layernorm.weight": sd[p + "attention_norm.weight"],
                h + "post_attention_layernorm.weight": sd[p + "ffn_norm.weight"]}
    return out


def to_hf(model: Transformer):
    """A transformers causal LM with identical weights (float32, eval mode)."""
    # optional dependency: only an export needs transformers
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    cfg = model.cfg
    if cfg.rope_grid or cfg.cross_dim or cfg.cond_kind != "none":
        raise ValueError("to_hf exports text Transformers (1D RoPE, no cross-attention or condition embedding)")
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.hd, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                  max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=cfg.tie_embeddings)
    if cfg.rope_scaling:  # transformers 4.x reads `rope_scaling`; 5.x moves it into rope_parameters
        common["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.qk_norm:
        hf = Qwen3ForCausalLM(Qwen3Config(**common, attention_bias=cfg.qkv_bias))
    elif cfg.qkv_bias:
        hf = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        hf = LlamaForCausalLM(LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    hf.load_state_dict(hf_state(model), strict=not cfg.tie_embeddings)
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf.float().eval()
