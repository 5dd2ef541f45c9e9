"""Build a `transformers` LlamaForCausalLM / Qwen2ForCausalLM holding the same weights as a specgen Transformer.

Used for the `hf` benchmark row (transformers' own `generate` on identical weights) and by the tests
that prove specgen's logits equal transformers'.
"""

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
        out |= {h + "self_attn.o_proj.weight": sd[p + "attention.wo.weight"],
                h + "mlp.gate_proj.weight": sd[p + "feed_forward.w1.weight"],
                h + "mlp.up_proj.weight": sd[p + "feed_forward.w3.weight"],
                h + "mlp.down_proj.weight": sd[p + "feed_forward.w2.weight"],
                h + "input_layernorm.weight": sd[p + "attention_norm.weight"],
                h + "post_attention_layernorm.weight": sd[p + "ffn_norm.weight"]}
    return out


def to_hf(model: Transformer):
    """A transformers causal LM with identical weights (float32, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = model.cfg
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.hd, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                  max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=cfg.tie_embeddings)
    if cfg.qkv_bias:
        hf = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        hf = LlamaForCausalLM(LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    hf.load_state_dict(hf_state(model), strict=not cfg.tie_embeddings)
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf.float().eval()
