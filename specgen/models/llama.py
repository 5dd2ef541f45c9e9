"""Llama-family HF folders, and the tensor names GGUF files map through (gguf_loader.py): loaded exactly or refused."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from specgen.errors import CheckpointError, UsageError
from specgen.models.rope import per_head, spread_order
from specgen.models.transformer import Transformer, TransformerConfig
from specgen.models.unfilled import random_fills_skipped

MAX_CONTEXT = 8192  # the longest context specgen builds RoPE tables for (longer ones are capped to it)
SHARD_INDEX = "model.safetensors.index.json"  # a sharded HF checkpoint's tensor -> file map

# name -> transformers' class defaults of the math keys a config.json may leave out (else rope_theta 10000, untied)
HF_ARCHITECTURES = {
    "LlamaForCausalLM": {"max_position_embeddings": 2048},
    "MistralForCausalLM": {"max_position_embeddings": 131072, "num_key_value_heads": 8},
    "Qwen2ForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 32},
    "Qwen3ForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},
    "Phi3ForCausalLM": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5},  # Phi-3, Phi-4: fused products
    "SmolLM3ForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 4, "rope_theta": 2000000.0,
                           "tie_word_embeddings": True},  # Llama's math, some layers without RoPE (nope_layers)
    "GemmaForCausalLM": {"max_position_embeddings": 8192, "num_key_value_heads": 16, "head_dim": 256,
                         "tie_word_embeddings": True},  # Gemma 1 (2B, 7B, CodeGemma)
    "Gemma2ForCausalLM": {"max_position_embeddings": 8192, "num_key_value_heads": 4, "head_dim": 256,
                          "tie_word_embeddings": True},  # Gemma 2 (2B, 9B, 27B)
    "Gemma3ForCausalLM": {"max_position_embeddings": 131072, "num_key_value_heads": 4, "head_dim": 256,
                          "rope_theta": 1000000.0, "tie_word_embeddings": True},  # Gemma 3 text (270M, 1B)
    # OLMo 2 (1B, 7B, 13B, 32B): one key/value head per query head where unset, its own norm epsilon
    "Olmo2ForCausalLM": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5},
    # Granite 3.x dense (2B, 8B): Llama's block and class defaults, four multipliers (granite_fields, granite_fold)
    "GraniteForCausalLM": {"max_position_embeddings": 2048},
    # Mixtral (8x7B, 8x22B): Mistral's attention, a routed feed-forward of 8 experts, 2 a token (expert_fields)
    "MixtralForCausalLM": {"max_position_embeddings": 131072, "num_key_value_heads": 8, "rope_theta": 1000000.0,
                           "rms_norm_eps": 1e-5, "num_local_experts": 8, "num_experts_per_tok": 2},
    # Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention (q/k norms), 128 experts of 768, 8 a token (expert_fields)
    "Qwen3MoeForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 4, "num_local_experts": 128,
                            "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    # Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases: qkv_bias), 60 experts of 1408,
    # 4 a token, and a gated shared expert of 5632 on every token (qwen2_moe_fields)
    "Qwen2MoeForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 16, "num_local_experts": 60,
                            "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                            "shared_expert_intermediate_size": 5632},
    # OLMoE (1B-7B): Llama's pre-norm block with OLMo 2's q/k norms over whole projections, 64 experts of
    # intermediate_size, 8 a token; one key/value head per query head where unset
    "OlmoeForCausalLM": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "num_local_experts": 64,
                         "num_experts_per_tok": 8},
    # OLMo 3 (7B, 32B): OLMo 2's block, three sliding layers in four, a RoPE dict per layer kind (per_kind_rope)
    "Olmo3ForCausalLM": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0},
    # EXAONE 4 (1.2B, 32B): output norms only, per-head q/k norms, sliding layers, the global ones NoPE (exaone4_nope)
    "Exaone4ForCausalLM": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "num_key_value_heads": 32},
}
# an architecture -> the TransformerConfig fields of its block beyond Llama's (the Gemmas' config-dependent ones:
# FIELDS; their norm offsets and Gemma 2's and 3's attention scales are folded into the weights at load: FOLDS)
BLOCKS = {"Qwen2ForCausalLM": {"qkv_bias": True}, "Qwen3ForCausalLM": {"qk_norm": True},
          "GemmaForCausalLM": {"ffn_act": "gelu_tanh"},
          "Gemma2ForCausalLM": {"sandwich_norms": True, "ffn_act": "gelu_tanh"},  # Gemma 3's, without q/k norms
          "Gemma3ForCausalLM": {"qk_norm": True, "sandwich_norms": True, "ffn_act": "gelu_tanh"},
          # OLMo 2: no norm before the sublayers, each output normed before its add, q and k normed whole
          "Olmo2ForCausalLM": {"qk_norm": True, "qk_norm_span": "all", "sandwich_norms": True, "pre_norms": False},
          "Olmo3ForCausalLM": {"qk_norm": True, "qk_norm_span": "all", "sandwich_norms": True, "pre_norms": False},
          # EXAONE 4: OLMo 2's norms with Qwen3's per-head q/k norms
          "Exaone4ForCausalLM": {"qk_norm": True, "sandwich_norms": True, "pre_norms": False},
          "Qwen3MoeForCausalLM": {"qk_norm": True},
          "OlmoeForCausalLM": {"qk_norm": True, "qk_norm_span": "all"}}  # (its q/k/v biases: qwen2_moe_fields)
# an architecture -> (the config key naming its gate's activation, the values specgen implements: its block's);
# Gemma 1's legacy "gelu" is read by its class as the tanh approximation
# Gemma 2's and 3's classes read only hidden_activation (a hidden_act beside it is ignored, as in their config.json)
ACTIVATION_KEYS = {"GemmaForCausalLM": ("hidden_act", ("gelu_pytorch_tanh", "gelu")),
                   "Gemma2ForCausalLM": ("hidden_activation", ("gelu_pytorch_tanh",)),
                   "Gemma3ForCausalLM": ("hidden_activation", ("gelu_pytorch_tanh",))}
SILU = ("hidden_act", ("silu", "swish"))  # every other architecture's: SwiGLU
# architectures transformers has and specgen refuses, with the reason (the rest: "unsupported architecture")
REFUSED_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "a multimodal Gemma 3 checkpoint (vision tower and text model); import a "
                                      "text-only one (Gemma3ForCausalLM: gemma-3-270m, gemma-3-1b and their -it)",
}
# an architecture -> the keys its transformers class reads that change the math where set (true, or not null), each
# refused then (specgen's q/k/v biases are Qwen2's, which that class always has)
SET_KEYS = {"LlamaForCausalLM": ("attention_bias", "mlp_bias"), "Qwen3ForCausalLM": ("attention_bias",),
            "SmolLM3ForCausalLM": ("attention_bias", "mlp_bias"),
            "GemmaForCausalLM": ("attention_bias", "use_bidirectional_attention"),
            "Gemma2ForCausalLM": ("attention_bias", "use_bidirectional_attention"),
            "Gemma3ForCausalLM": ("attention_bias", "attn_logit_softcapping", "use_bidirectional_attention"),
            "Olmo2ForCausalLM": ("attention_bias",), "Olmo3ForCausalLM": ("attention_bias",),
            "GraniteForCausalLM": ("attention_bias", "mlp_bias"),
            "Qwen3MoeForCausalLM": ("attention_bias",),
            "OlmoeForCausalLM": ("attention_bias", "clip_qkv", "sliding_window")}
WHY_SET = {"attention_bias": "biases on q/k/v and o_proj are not implemented",
           # (Gemma 3's: its transformers class keeps the key but caps no score; the config says another model)
           "attn_logit_softcapping": "transformers' Gemma3ForCausalLM ignores this cap, which its config sets: which "
                                     "model is meant is unclear",
           "mlp_bias": "MLP biases are not implemented",
           "clip_qkv": "clamping q, k and v is not implemented",
           # (OLMoE's: no key of its config class; its attention passes it to flash attention only, SDPA and eager
           # attend fully; the config says another model than its default attention runs)
           "sliding_window": "transformers' OlmoeForCausalLM slides only under flash attention (SDPA and eager "
                             "attend fully): which model is meant is unclear",
           "use_bidirectional_attention": "bidirectional attention is not a causal LM's (specgen decodes causally)"}
# an architecture (HF or GGUF name) -> its fused tensors as the Llama names the loader maps: a Llama name's suffix ->
# (the fused tensor's suffix, which part of it along dim 0: q, k, v of the projection's rows; the gate's, then up's)
FUSED = {
    "Phi3ForCausalLM": {**{f"self_attn.{x}_proj.weight": ("self_attn.qkv_proj.weight", i) for i, x in enumerate("qkv")},
                        "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
                        "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1)},
    "phi3": {**{f"attn_{x}.weight": ("attn_qkv.weight", i) for i, x in enumerate("qkv")},
             "ffn_gate.weight": ("ffn_up.weight", 0), "ffn_up.weight": ("ffn_up.weight", 1)},
}


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint (HF folder or GGUF) as specgen's Transformer: its config, its weights under specgen's names, and
    the context the checkpoint declares (`max_position_embeddings`, `<arch>.context_length`), which `capped_context`
    caps to the config's max_seq_len."""

    cfg: TransformerConfig
    state: dict[str, torch.Tensor]
    context: int

    def record(self) -> dict:
        """What a registry entry records of the checkpoint beside its config: `source_context`, its own context,
        where specgen's is shorter (docs/architectures.md)."""
        return {"source_context": self.context} if self.context > self.cfg.max_seq_len else {}


def refuse(key: str, value, why: str) -> UsageError:
    return UsageError(f"config.json sets {key}={json.dumps(value)}: {why}; specgen refuses rather than decode wrong "
                      "(docs/architectures.md)")


def hf_config(raw: dict) -> TransformerConfig:
    """TransformerConfig from an HF `config.json` dict; a key that changes the math and is not implemented is
    refused with one line naming it, and so is a number that builds no model (check_numbers, grouped heads)."""
    arch = (raw.get("architectures") or ["?"])[0]
    if arch not in HF_ARCHITECTURES:
        why = f" ({REFUSED_ARCHITECTURES[arch]})" if arch in REFUSED_ARCHITECTURES else ""
        raise UsageError(f"unsupported architecture {arch}{why}; supported: {', '.join(HF_ARCHITECTURES)}")
    defaults = HF_ARCHITECTURES[arch]
    check_unsupported(raw, arch)
    check_numbers(raw)
    raw, extra = FIELDS.get(arch, lambda r: (r, {}))(raw)  # the Gemmas: their embedding scale, Gemma 3's RoPEs
    n_heads = raw["num_attention_heads"]
    n_kv_heads = kv_heads(raw, arch, n_heads)
    if n_heads % n_kv_heads:  # grouped-query attention: each key/value head serves as many query heads
        raise CheckpointError(f"config.json sets num_attention_heads={n_heads} over num_key_value_heads={n_kv_heads}: "
                              "the query heads do not share the key/value heads evenly")
    context = declared_context(raw)
    scaling, theta = rope_scaling(raw, context, defaults.get("rope_theta", 10000.0))
    head_dim = raw.get("head_dim") or defaults.get("head_dim", 0)
    try:
        return TransformerConfig(
            vocab_size=raw["vocab_size"], dim=raw["hidden_size"], n_layers=raw["num_hidden_layers"], n_heads=n_heads,
            n_kv_heads=n_kv_heads, ffn_dim=raw["intermediate_size"], head_dim=head_dim,
            norm_eps=raw.get("rms_norm_eps", defaults.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_layout="half",
            rope_scaling=scaling,
            max_seq_len=capped_context(context, scaling),
            tie_embeddings=bool(raw.get("tie_word_embeddings", defaults.get("tie_word_embeddings", False))),
            rope_dim=rope_dim(raw, arch, head_dim or raw["hidden_size"] // n_heads), nope_layers=nope_layers(raw, arch),
            **BLOCKS.get(arch, {}), **(extra | sliding_fields(raw, arch)),
        )
    except ValueError as e:  # a RoPE factor list of another length than the head's frequencies
        raise UsageError(f"config.json: {e}") from None


#: the architectures whose config class types num_key_value_heads int and refuses a null
KV_HEADS_TYPED = ("MistralForCausalLM", "Exaone4ForCausalLM")


def kv_heads(raw: dict, arch: str, n_heads: int) -> int:
    """num_key_value_heads as transformers reads it: absent, the class default; null, one per query head (each class's
    __post_init__), except where the class types the key int and refuses a null (KV_HEADS_TYPED)."""
    if "num_key_value_heads" not in raw:
        return HF_ARCHITECTURES[arch].get("num_key_value_heads", n_heads)
    if raw["num_key_value_heads"] is None and arch in KV_HEADS_TYPED:
        raise CheckpointError(f"config.json sets num_key_value_heads=null: not a positive integer "
                              f"({arch.replace('ForCausalLM', 'Config')})")
    return raw["num_key_value_heads"] or n_heads  # check_numbers: a positive int or null


REQUIRED_COUNTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
OPTIONAL_COUNTS = ("num_key_value_heads", "head_dim", "max_position_embeddings")  # null or absent: see the reader


def check_numbers(raw: dict) -> None:
    """Refuse a count that is no positive integer (a string, null, zero, a float) and an epsilon that is no positive
    number: carried into the entry, it would break at the entry's first use. A required count that is absent is left
    to the caller's KeyError ('lacks')."""
    for key in REQUIRED_COUNTS + OPTIONAL_COUNTS:
        if raw.get(key) is not None or key in raw and key in REQUIRED_COUNTS:
            count(key, raw[key])
    if "rms_norm_eps" in raw:
        positive_number("rms_norm_eps", raw["rms_norm_eps"])


def count(key: str, value, source: str = "config.json") -> int:
    """The rule for a count, of a config.json or a GGUF (gguf_loader): an int above 0 (not a bool, float or string)."""
    if type(value) is not int or value < 1:
        raise CheckpointError(f"{source} sets {key}={json.dumps(value)}: not a positive integer")
    return value


def positive_number(key: str, value, source: str = "config.json") -> float:
    if type(value) not in (int, float) or not 0 < value < math.inf:
        raise CheckpointError(f"{source} sets {key}={json.dumps(value)}: not a positive number")
    return float(value)


def declared_context(raw: dict) -> int:
    """The context an HF config declares: `max_position_embeddings`, else its class default (HF_ARCHITECTURES)."""
    arch = (raw.get("architectures") or ["?"])[0]
    return int(raw.get("max_position_embeddings") or HF_ARCHITECTURES[arch]["max_position_embeddings"])


def capped_context(context: int, scaling: dict | None) -> int:
    """specgen's context for a checkpoint's own (HF folder or GGUF): at most MAX_CONTEXT and LongRoPE's original
    context (past it every position's table changes). A sliding window caps nothing: its layers slide (`window`)."""
    original = scaling["original_max_position_embeddings"] if scaling and scaling["rope_type"] == "longrope" else None
    return min(context, MAX_CONTEXT, original or context)


def check_unsupported(raw: dict, arch: str) -> None:
    """Refuse keys whose math specgen's decoder does not have (activation, biases, bidirectional attention, quantized
    weights)."""
    key, implemented = ACTIVATION_KEYS.get(arch, SILU)
    if raw.get(key, implemented[0]) not in implemented:
        raise refuse(key, raw[key], f"specgen's {arch} gate is {implemented[0]} only")
    for key in SET_KEYS.get(arch, ()):
        if raw.get(key):
            raise refuse(key, raw[key], WHY_SET[key])
    if quant := raw.get("quantization_config"):
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise refuse("quantization_config", {"quant_method": method}, "pre-quantized HF weights are not loaded; "
                     "import the float checkpoint (specgen quantizes it itself)")


def rope_scaling(raw: dict, context: int, default_theta: float = 10000.0) -> tuple[dict | None, float]:
    """(TransformerConfig.rope_scaling, rope_theta) from `rope_scaling` (transformers 4) or `rope_parameters` (5);
    like transformers, a non-empty `rope_scaling` wins; no `rope_theta` anywhere: the class's `default_theta`."""
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise refuse(key, params, "per-layer RoPE parameters are not implemented")
    theta = positive_number("rope_theta", params.get("rope_theta") or raw.get("rope_theta") or default_theta)
    kind = params.get("rope_type", params.get("type", "default"))

    def need(name: str):
        if params.get(name) is None:
            raise UsageError(f"config.json {key} of type {kind} lacks {name}")
        return params[name]

    if kind in ("default", "dynamic"):  # dynamic NTK changes the table only past max_position_embeddings, which
        return None, theta  # caps specgen's context (hf_config): below it transformers computes the default table
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(need("factor"))}, theta
    # a top-level original_max_position_embeddings wins, as in transformers (Phi-3 style configs)
    original = int(raw.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or context)
    if kind == "llama3":
        return {"rope_type": "llama3", "factor": float(need("factor")),
                "low_freq_factor": float(need("low_freq_factor")), "high_freq_factor": float(need("high_freq_factor")),
                "original_max_position_embeddings": original}, theta
    if kind == "yarn":
        factor = float(params.get("factor") or context / original)
        attention = params.get("attention_factor")
        if attention is None:  # YaRN's mscale (0.1 ln s + 1), DeepSeek's ratio form when mscale and mscale_all_dim
            mscale = lambda scale, m=1.0: 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0  # noqa: E731
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            attention = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                "attention_factor": float(attention), "beta_fast": float(params.get("beta_fast") or 32),
                "beta_slow": float(params.get("beta_slow") or 1),
                "truncate": bool(params.get("truncate", True))}, theta
    if kind in ("longrope", "su"):  # short factors within the original context, which caps specgen's (hf_config);
        # "su": LongRoPE's first name, in Phi-3-128k's config, which transformers reads as longrope
        factor = float(params.get("factor") or context / original)
        attention = params.get("attention_factor")
        if attention is None:  # LongRoPE's sqrt(1 + ln s / ln L), 1 when the context is not extended
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        return {"rope_type": "longrope", "short_factor": [float(f) for f in need("short_factor")],
                "long_factor": [float(f) for f in need("long_factor")], "attention_factor": float(attention),
                "original_max_position_embeddings": original}, theta
    raise refuse(f"{key}.rope_type", kind, "this RoPE type is not implemented (supported: default, linear, dynamic, "
                 "llama3, yarn, longrope)")


def rope_dim(raw: dict, arch: str, head_dim: int) -> int:
    """TransformerConfig.rope_dim: the dims partial RoPE rotates (`partial_rotary_factor` of a head, Phi-4-mini's
    0.75), 0 for whole heads; read where transformers reads it, the RoPE dict before the top level."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters")
    factor = (params if isinstance(params, dict) else {}).get("partial_rotary_factor",
                                                             raw.get("partial_rotary_factor", 1.0))
    if factor == 1:
        return 0
    if not isinstance(factor, (int, float)):
        raise refuse("partial_rotary_factor", factor, "not a number")
    if arch != "Phi3ForCausalLM":  # transformers' Llama, Mistral, Qwen: whole heads (default RoPE), or fail (scaled)
        raise refuse("partial_rotary_factor", factor, f"partial RoPE is implemented for Phi3ForCausalLM, not {arch}")
    dims = int(head_dim * factor)  # transformers' rounding
    if not 0 < dims <= head_dim or dims % 2:
        raise refuse("partial_rotary_factor", factor, f"rotates {dims} of a head's {head_dim} dims; partial RoPE "
                     f"needs an even number of them from 2 to {head_dim}")
    return dims


def spread_rotary(cfg: TransformerConfig, ours: str, parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Partial RoPE: a parameter's q and k rows (projections, biases, per-head norms) in `rope.spread_order`, so the
    kernels' whole-head rotation rotates transformers' rotary dims and leaves the others."""
    order = spread_order(cfg.hd, cfg.rope_dim)
    if ".wqkv." in ours:  # q, k, v: v is not rotated
        return [per_head(parts[0], order), per_head(parts[1], order), parts[2]]
    return [per_head(parts[0], order)] if ours.endswith(("q_norm.weight", "k_norm.weight")) else parts


def nope_layers(raw: dict, arch: str) -> tuple[int, ...]:
    """TransformerConfig.nope_layers: the layers whose attention applies no RoPE, as `arch`'s class derives them
    (NOPE); () for a class that turns every layer."""
    return tuple(NOPE[arch](raw)) if arch in NOPE else ()


def smollm3_nope(raw: dict) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE, those its `no_rope_layers` marks 0 (1: RoPE); without that list, as
    transformers derives it, every `no_rope_layer_interval`-th (layer i when (i + 1) % interval == 0). A list that
    does not give each layer one 0 or 1 is refused as corrupt (transformers would read a longer one's first entries
    and any truthy value as RoPE)."""
    n = raw["num_hidden_layers"]
    marks = raw.get("no_rope_layers")
    if marks is None:
        interval = raw.get("no_rope_layer_interval", 4)
        if not (type(interval) is int and interval > 0):
            raise CheckpointError(f"config.json sets no_rope_layer_interval={json.dumps(interval)}: not a positive "
                                  "integer")
        return tuple(i for i in range(n) if (i + 1) % interval == 0)
    if not isinstance(marks, list) or len(marks) != n or not all(type(m) is int and m in (0, 1) for m in marks):
        raise CheckpointError(f"config.json sets no_rope_layers={json.dumps(marks)}: not one 0 (no RoPE) or 1 (RoPE) "
                              f"for each of its {n} layers")
    return tuple(i for i, m in enumerate(marks) if m == 0)


def exaone4_nope(raw: dict) -> list[int]:
    """EXAONE 4's layers without RoPE: where a window is set (its attention's test: `sliding_window` not null), those
    that do not slide; without one, none (every layer turns and attends fully)."""
    if raw.get("sliding_window", 4096) is None:
        return []
    return [i for i, kind in enumerate(patterned_layer_types(raw, "Exaone4ForCausalLM")) if kind == "full_attention"]


#: an architecture -> its layers without RoPE as its class derives them from a config
NOPE = {"SmolLM3ForCausalLM": smollm3_nope, "Exaone4ForCausalLM": exaone4_nope}


def sliding_fields(raw: dict, arch: str) -> dict:
    """The TransformerConfig fields of a config's sliding layers: `window` and which layers slide (`local_layers`,
    each class's derivation in transformers 5: its shared mask, a query at p sees keys at p - window + 1 .. p); {}
    where none slides."""
    window, layers = SLIDING.get(arch, lambda r: (None, ()))(raw)
    if window is None or not layers:
        return {}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise refuse("sliding_window", window, "not a positive window")
    return {"window": window, "local_layers": tuple(layers)}


def every_layer_slides(default: int | None) -> Callable[[dict], tuple]:
    """Mistral's and Phi-3's: every layer slides where a window is set (`default`: the class's)."""
    return lambda raw: (raw.get("sliding_window", default), range(raw["num_hidden_layers"]))


def marked(raw: dict) -> list[int]:
    """The layers `layer_types` marks sliding_attention (a kind other than full and sliding is refused)."""
    layer_kinds(raw)
    return [i for i, kind in enumerate(raw.get("layer_types") or []) if kind == "sliding_attention"]


def smollm3_sliding(raw: dict) -> tuple:
    """SmolLM3's: the layers layer_types marks; without it, where use_sliding_window and a window are set, the NoPE
    layers (transformers' derivation). A marked layer without a window: transformers cannot build its mask."""
    window = raw.get("sliding_window")
    if raw.get("layer_types"):
        layers = marked(raw)
    else:
        layers = nope_layers(raw, "SmolLM3ForCausalLM") if raw.get("use_sliding_window", False) and window else ()
    if layers and window is None:
        raise refuse("sliding_window", None, "layer_types marks sliding_attention layers but sets no window")
    return window, layers


def typed_sliding(arch: str) -> Callable[[dict], tuple]:
    """Gemma 2's and 3's, OLMo 3's, EXAONE 4's: the layers `patterned_layer_types` marks sliding (layer_types, or the
    class's pattern), window default 4096 (each class's); sliding layers without a window are refused (transformers
    cannot build their mask either)."""
    return lambda raw: kinds_sliding(raw, patterned_layer_types(raw, arch))


def kinds_sliding(raw: dict, kinds: list[str]) -> tuple:
    """(window, sliding layers) of a config whose layer `kinds` are given: the window default 4096."""
    window = raw.get("sliding_window", 4096)
    layers = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    if layers and window is None:  # transformers cannot build those layers' mask either
        raise refuse("sliding_window", None, "sliding_attention layers but no window")
    return window, layers


def qwen_sliding(raw: dict) -> tuple:
    """Qwen2's and Qwen3's: only with use_sliding_window (else the class drops the window), the layers layer_types
    marks (transformers 5) or else those at or past max_window_layers (default 28; the class's derivation)."""
    kinds = layer_kinds(raw)
    if not raw.get("use_sliding_window", False):
        return None, ()
    first = raw.get("max_window_layers", 28)
    layers = marked(raw) if kinds else range(first, raw["num_hidden_layers"]) if isinstance(first, int) else ()
    return raw.get("sliding_window", 4096), layers


def qwen2_moe_sliding(raw: dict) -> tuple:
    """Qwen2-MoE's (transformers 5): only with use_sliding_window, over sliding_window (default 4096), the layers
    layer_types marks or else every even layer below max_window_layers (default 28; its class's derivation, unlike
    Qwen2's). Its class fails to decode where a layer slides without use_sliding_window (a window of 0 hides every
    key) or use_sliding_window has no window (no sliding mask): both refused."""
    kinds = layer_kinds(raw)
    if not raw.get("use_sliding_window", False):
        if "sliding_attention" in kinds:
            raise refuse("layer_types", sorted(kinds), "sliding_attention layers without use_sliding_window (a window "
                         "of 0 in transformers' Qwen2MoeForCausalLM, which then sees no key)")
        return None, ()
    window, first = raw.get("sliding_window", 4096), raw.get("max_window_layers", 28)
    if window is None:
        raise refuse("sliding_window", None, "use_sliding_window without a window (transformers' "
                     "Qwen2MoeForCausalLM cannot build its sliding mask)")
    if not kinds and type(first) is not int:
        raise CheckpointError(f"config.json sets max_window_layers={json.dumps(first)}: not a layer count")
    layers = marked(raw) if kinds else [i for i in range(raw["num_hidden_layers"]) if i % 2 == 0 and i < first]
    return window, layers


#: an architecture -> (its window, the layers that slide) as transformers derives them from a config
SLIDING = {"MistralForCausalLM": every_layer_slides(4096), "Phi3ForCausalLM": every_layer_slides(None),
           "SmolLM3ForCausalLM": smollm3_sliding,
           **{arch: typed_sliding(arch) for arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Olmo3ForCausalLM",
                                                      "Exaone4ForCausalLM")},
           "Qwen2ForCausalLM": qwen_sliding, "Qwen3ForCausalLM": qwen_sliding,
           "MixtralForCausalLM": every_layer_slides(None),  # its class: every layer, where a window is set
           # Qwen3-MoE's class: every layer, only with use_sliding_window (its config drops the window otherwise)
           "Qwen3MoeForCausalLM": lambda raw: every_layer_slides(4096)(raw) if raw.get("use_sliding_window") else (
               None, ()),
           "Qwen2MoeForCausalLM": qwen2_moe_sliding}


def layer_kinds(raw: dict) -> set[str]:
    """The attention kinds `layer_types` names; a kind other than full and sliding attention is refused, and so is a
    `layer_types` that is not one kind a layer (transformers refuses it; each class's layers are its indices)."""
    types, n = raw.get("layer_types") or [], raw["num_hidden_layers"]
    if types and (not isinstance(types, list) or len(types) != n or not all(isinstance(k, str) for k in types)):
        raise CheckpointError(f"config.json sets layer_types={json.dumps(types)[:80]}: not one kind for each of its "
                              f"{n} layers")
    kinds = set(types)
    if kinds - {"full_attention", "sliding_attention"}:
        raise refuse("layer_types", sorted(kinds), "only full_attention and sliding_attention layers are implemented")
    return kinds


def given_layer_types(raw: dict) -> list[str] | None:
    """A Gemma config's `layer_types` where it sets one, checked: one known kind a layer (the Gemma classes read it as
    given; an empty list is refused too); None where it sets none (the class derives the kinds)."""
    n = raw["num_hidden_layers"]
    if raw.get("layer_types") is None:
        return None
    layer_kinds(raw)
    if len(raw["layer_types"]) != n:  # an empty list (`layer_kinds` checked any other)
        raise CheckpointError(f"config.json sets layer_types={json.dumps(raw['layer_types'])[:80]}: not one kind "
                              f"for each of its {n} layers")
    return raw["layer_types"]


def exaone4_pattern(raw: dict) -> int:
    """EXAONE 4's `sliding_window_pattern` (default 4) where its config sets no layer_types. Its class derives no
    kinds from a null window (a pattern of 0: it divides by it) or a pattern string ("LLLG": an int % str), both
    refused; its docstring's last layer always global is not what its code does (the pattern alone)."""
    if raw.get("sliding_window", 4096) is None:
        raise refuse("sliding_window", None, "without layer_types transformers' Exaone4Config derives no layer kinds "
                     "(it divides by a pattern of 0)")
    pattern = raw.get("sliding_window_pattern", 4)
    if isinstance(pattern, str):
        raise refuse("sliding_window_pattern", pattern, "a pattern string without layer_types: transformers' "
                     "Exaone4Config derives no layer kinds from one (int % str)")
    return pattern


#: an architecture -> its class's pattern p where a config sets no layer_types: layer i slides unless (i + 1) % p is 0
#: (Gemma 2's every other layer from 0, llama.cpp's gemma2 too: swa pattern 2; OLMo 3's three in four)
PATTERNS = {"Gemma2ForCausalLM": lambda raw: 2, "Gemma3ForCausalLM": lambda raw: raw.get("sliding_window_pattern", 6),
            "Olmo3ForCausalLM": lambda raw: 4, "Exaone4ForCausalLM": exaone4_pattern}


def patterned_layer_types(raw: dict, arch: str) -> list[str]:
    """A config's layer kinds as `arch`'s class reads them: `layer_types` (one known kind a layer), else layer i
    slides unless (i + 1) % its pattern (PATTERNS, a positive int) is 0, its class's derivation."""
    n = raw["num_hidden_layers"]
    if (given := given_layer_types(raw)) is not None:
        return given
    pattern = PATTERNS[arch](raw)
    if type(pattern) is not int or pattern < 1:
        raise CheckpointError(f"config.json sets sliding_window_pattern={json.dumps(pattern)}: not a positive integer")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


#: an architecture reading one RoPE dict per layer kind -> (the full layers' base where neither its dict nor
#: rope_theta sets one, the key of the sliding layers' base beside their dict (None: none), that base's default).
#: OLMo 3's class reads a top-level rope_theta into the full layers' dict only (it pops the key once, then takes the
#: default for the sliding layers' dict)
KIND_ROPE = {"Gemma3ForCausalLM": (1000000.0, "rope_local_base_freq", 10000.0),
             "Olmo3ForCausalLM": (500000.0, None, 500000.0)}


def per_kind_rope(raw: dict, arch: str) -> tuple[dict, dict]:
    """A config's (full, sliding) layers' RoPE dicts as `arch`'s class reads them: `rope_parameters` per layer kind
    (transformers 5), a legacy `rope_scaling` updating the full one, the bases (KIND_ROPE) where the dicts set none;
    the sliding layers' RoPE unscaled (else refused), whole heads."""
    params = raw.get("rope_parameters") or {}
    if not isinstance(params, dict) or set(params) - {"full_attention", "sliding_attention"} or not all(
            isinstance(v, dict) or v is None for v in params.values()):
        raise refuse("rope_parameters", params, f"{arch} reads one RoPE dict per layer kind (full_attention, "
                     "sliding_attention)")
    full_theta, local_key, local_theta = KIND_ROPE[arch]
    full = {**(params.get("full_attention") or {}), **(raw.get("rope_scaling") or {})}
    local = dict(params.get("sliding_attention") or {})
    full.setdefault("rope_theta", raw.get("rope_theta") or full_theta)
    local.setdefault("rope_theta", raw.get(local_key) or local_theta)
    for kind, p in (("full_attention", full), ("sliding_attention", local)):
        if p.get("partial_rotary_factor", 1.0) != 1:
            raise refuse(f"rope_parameters.{kind}.partial_rotary_factor", p["partial_rotary_factor"],
                         f"partial RoPE is implemented for Phi3ForCausalLM, not {arch}")
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise refuse("rope_parameters.sliding_attention.rope_type", local.get("rope_type", local.get("type")),
                     "specgen's local layers turn with an unscaled RoPE")
    return full, local


def per_kind_fields(raw: dict, arch: str) -> tuple[dict, dict]:
    """A config with a RoPE dict per layer kind (Gemma 3, OLMo 3) as hf_config reads it: the config with its full
    layers' RoPE as a flat `rope_parameters` (read as every other class's), and the local (sliding) layers with their
    own RoPE base (their window: SLIDING)."""
    full, local = per_kind_rope(raw, arch)
    flat = {k: v for k, v in raw.items() if k != "rope_scaling"} | {"rope_parameters": full}
    layers = tuple(i for i, kind in enumerate(patterned_layer_types(raw, arch)) if kind == "sliding_attention")
    theta = positive_number("rope_parameters.sliding_attention.rope_theta", local["rope_theta"]) if layers else 0.0
    return flat, {"local_layers": layers, "local_rope_theta": theta}


def gemma3_fields(raw: dict) -> tuple[dict, dict]:
    """A Gemma 3 config as hf_config reads it: `per_kind_fields`, and the embedding scale sqrt(hidden_size) and final
    cap it adds."""
    flat, extra = per_kind_fields(raw, "Gemma3ForCausalLM")
    return flat, extra | {"embed_scale": raw["hidden_size"] ** 0.5,
                          **softcaps(raw, {"final_logit_softcapping": None})}  # (its attention cap: check_unsupported)


CAP_FIELDS = {"attn_logit_softcapping": "attn_softcap", "final_logit_softcapping": "logit_softcap"}


def softcaps(raw: dict, defaults: dict[str, float | None]) -> dict:
    """The TransformerConfig caps of a Gemma 2 or 3 config from the keys `defaults` names (CAP_FIELDS:
    `attn_logit_softcapping`, each scaled attention score; `final_logit_softcapping`, each logit), absent their class
    defaults; null (None) is no cap, 0.0, as the classes skip it; a value is a positive number (0 or less would
    divide by 0 or flip the scores)."""
    out = {}
    for key, default in defaults.items():
        value = raw.get(key, default)
        out[CAP_FIELDS[key]] = 0.0 if value is None else positive_number(key, value)
    return out


def gemma2_fields(raw: dict) -> tuple[dict, dict]:
    """A Gemma 2 config as hf_config reads it: Llama's keys (one RoPE base for every layer), and the fields it adds:
    the embedding scale sqrt(hidden_size) and the two softcaps (class defaults 50 and 30). Its sliding layers:
    SLIDING; its norm offsets and attention scale: FOLDS."""
    return raw, {"embed_scale": raw["hidden_size"] ** 0.5,
                 **softcaps(raw, {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})}


def gemma_fields(raw: dict) -> tuple[dict, dict]:
    """A Gemma 1 config as hf_config reads it: Llama's keys, and the embedding scale sqrt(hidden_size) it adds."""
    return raw, {"embed_scale": raw["hidden_size"] ** 0.5}


GRANITE_KEYS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")


def granite_multipliers(raw: dict) -> dict[str, float]:
    """A Granite config's four multipliers (GraniteConfig's keys, class defaults 1), each a positive number."""
    return {key: positive_number(key, raw.get(key, 1.0)) for key in GRANITE_KEYS}


def granite_fields(raw: dict) -> tuple[dict, dict]:
    """A Granite config as hf_config reads it: Llama's keys, and the fields its multipliers add where no weight can
    hold them: the embedding's (embed_scale; a tied embedding is also the head) and the logits' divisor
    (logit_scale). Its attention and residual multipliers: FOLDS."""
    m = granite_multipliers(raw)
    return raw, {"embed_scale": m["embedding_multiplier"], "logit_scale": m["logits_scaling"]}


#: an architecture -> the keys its class reads its experts' count from, the first set one winning (Qwen2-MoE's class
#: maps no other name to num_experts; the others map num_local_experts and num_experts to one another)
EXPERT_KEYS = {"Qwen2MoeForCausalLM": ("num_experts",)}
#: the MoE architectures whose class builds every layer's dense MLP (of intermediate_size) where num_experts is 0
DENSE_WITHOUT_EXPERTS = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")


def expert_count(raw: dict, arch: str) -> int:
    """A MoE config's experts: `num_local_experts`, or `num_experts` (the Qwen MoEs' and OLMoE's config.json; each
    class but Qwen2-MoE's maps the one name to the other: EXPERT_KEYS), else the class default; 0 (the Qwen MoEs:
    every layer dense) or a positive int."""
    keys = EXPERT_KEYS.get(arch, ("num_local_experts", "num_experts"))
    key = next((k for k in keys if raw.get(k) is not None), keys[0])
    n = raw.get(key, HF_ARCHITECTURES[arch]["num_local_experts"])
    return 0 if n == 0 and arch in DENSE_WITHOUT_EXPERTS else count(key, n)


def expert_fields(raw: dict, arch: str, width_key: str, renorm: bool, weights_rounded: bool) -> tuple[dict, dict]:
    """A MoE config as hf_config reads it: its experts' width (`width_key`) as the feed-forward's (intermediate_size,
    which no layer of theirs reads), and the routing fields: E experts, k a token (`num_experts_per_tok`),
    `renorm` (the k weights renormalised) and whether the weights are rounded to the activation dtype before they
    scale (`weights_rounded`). The router's training knobs (aux loss, jitter) change no inference: ignored."""
    defaults = HF_ARCHITECTURES[arch]
    n = expert_count(raw, arch)
    if not n:  # a Qwen MoE without experts: every layer its dense MLP of intermediate_size (Qwen2's or 3's block)
        return raw, {}
    k = count("num_experts_per_tok", raw.get("num_experts_per_tok", defaults["num_experts_per_tok"]))
    if k > n:
        raise CheckpointError(f"config.json sets num_experts_per_tok={k}: more than its {n} experts")
    width = count(width_key, raw.get(width_key, defaults.get(width_key)) if width_key in defaults else raw[width_key])
    return {**raw, "intermediate_size": width}, {"n_experts": n, "experts_per_token": k, "expert_renorm": renorm,
                                                 "expert_weight_round": weights_rounded}


def flag(raw: dict, key: str, default: bool) -> bool:
    """A true/false key of a config (its class default where absent); another value is refused as corrupt."""
    value = raw.get(key, default)
    if type(value) is not bool:
        raise CheckpointError(f"config.json sets {key}={json.dumps(value)}: not true or false")
    return value


def topk_fields(raw: dict, arch: str, width_key: str) -> tuple[dict, dict]:
    """A config whose router renormalises by norm_topk_prob (default false) and rounds the k weights to the
    activation dtype before they scale (its router's cast: Qwen2-MoE, Qwen3-MoE, OLMoE), experts of `width_key`."""
    return expert_fields(raw, arch, width_key, flag(raw, "norm_topk_prob", False), True)


def qwen_moe_fields(raw: dict, arch: str) -> tuple[dict, dict]:
    """A Qwen2-MoE or Qwen3-MoE config: experts of moe_intermediate_size in every layer (a dense layer,
    `mlp_only_layers` or a `decoder_sparse_step` other than 1, refused), `topk_fields`' routing."""
    if raw.get("mlp_only_layers"):
        raise refuse("mlp_only_layers", raw["mlp_only_layers"], "dense layers among routed ones are not implemented")
    if raw.get("decoder_sparse_step", 1) != 1 and expert_count(raw, arch):
        raise refuse("decoder_sparse_step", raw["decoder_sparse_step"], "dense layers among routed ones (every "
                     "layer but each decoder_sparse_step-th) are not implemented")
    return topk_fields(raw, arch, "moe_intermediate_size")


def qwen2_moe_fields(raw: dict) -> tuple[dict, dict]:
    """A Qwen2-MoE config: `qwen_moe_fields`, q/k/v biases where qkv_bias (its class's key, default true) and, beside
    routed experts, the shared expert of shared_expert_intermediate_size."""
    raw, extra = qwen_moe_fields(raw, "Qwen2MoeForCausalLM")
    key, defaults = "shared_expert_intermediate_size", HF_ARCHITECTURES["Qwen2MoeForCausalLM"]
    shared = {"shared_expert_dim": count(key, raw.get(key, defaults[key]))} if extra else {}
    return raw, extra | shared | {"qkv_bias": flag(raw, "qkv_bias", True)}


#: an architecture -> its config read as (the config hf_config reads on, the TransformerConfig fields it adds)
FIELDS = {"GemmaForCausalLM": gemma_fields, "Gemma2ForCausalLM": gemma2_fields, "Gemma3ForCausalLM": gemma3_fields,
          "Olmo3ForCausalLM": lambda raw: per_kind_fields(raw, "Olmo3ForCausalLM"),
          "GraniteForCausalLM": granite_fields,
          "Qwen3MoeForCausalLM": lambda raw: qwen_moe_fields(raw, "Qwen3MoeForCausalLM"),
          "Qwen2MoeForCausalLM": qwen2_moe_fields,
          "OlmoeForCausalLM": lambda raw: topk_fields(raw, "OlmoeForCausalLM", "intermediate_size"),
          # Mixtral: experts of intermediate_size, the k weights always renormalised, scaling in float32
          "MixtralForCausalLM": lambda raw: expert_fields(raw, "MixtralForCausalLM", "intermediate_size", True, False)}


def gemma_norms(name: str, t: torch.Tensor) -> torch.Tensor:
    """A Gemma HF tensor with each norm's stored w as the 1 + w it multiplies by (float32, as transformers adds it)."""
    return 1.0 + t if name.endswith("norm.weight") else t


def suffix_scales(scales: dict[str, float]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """A fold (name, tensor -> tensor) multiplying each tensor whose name ends with a key of `scales` by its value;
    the others, and any scale of 1, as they are."""
    def fold(name: str, t: torch.Tensor) -> torch.Tensor:
        scale = next((s for suffix, s in scales.items() if name.endswith(suffix)), 1.0)
        return t if scale == 1 else t * scale

    return fold


def gemma_scalar_fold(q_suffix: str) -> Callable[[dict, TransformerConfig], Callable]:
    """Gemma 2's and 3's HF tensors as specgen's model reads them: the norms' offsets folded (`gemma_norms`), and the
    tensor `q_suffix` names (Gemma 2: q's projection; Gemma 3: q's norm) times sqrt(head_dim / query_pre_attn_scalar),
    so that the kernels' 1/sqrt(head_dim) scores are transformers' query_pre_attn_scalar^-1/2 ones (1 where the scalar
    is the head size: Gemma 3 270M/1B, Gemma 2 2B/9B; not Gemma 2 27B: 144 over heads of 128). Exact: RoPE turns q
    linearly, and Gemma 2's softcap takes the score after the scale, as transformers' does."""
    def make(raw: dict, cfg: TransformerConfig) -> Callable[[str, torch.Tensor], torch.Tensor]:
        scale = (cfg.hd / positive_number("query_pre_attn_scalar", raw.get("query_pre_attn_scalar", 256))) ** 0.5
        scaled = suffix_scales({q_suffix: scale})
        return lambda name, t: scaled(name, gemma_norms(name, t))

    return make


def granite_scales(cfg: TransformerConfig, attention: float, residual: float, names: tuple[str, str, str]
                   ) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Granite's attention and residual multipliers folded into the weights (an HF folder's or a GGUF's: `names`, the
    suffixes of q's projection, the attention's output and the MLP's down projection): q's projection times
    attention * sqrt(head_dim), so that the kernels' 1/sqrt(head_dim) scores are Granite's q.k * attention (RoPE
    turns q linearly: the scale commutes with it); each sublayer's last projection times residual, so its output is
    x + residual * W y = x + (residual W) y (linear, no bias: biases are refused)."""
    q, out, down = names
    return suffix_scales({q: attention * cfg.hd**0.5, out: residual, down: residual})


def granite_fold(raw: dict, cfg: TransformerConfig) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """A Granite HF tensor as specgen's model reads it: `granite_scales` of its config's multipliers."""
    m = granite_multipliers(raw)
    return granite_scales(cfg, m["attention_multiplier"], m["residual_multiplier"],
                          ("self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"))


#: an architecture -> how its HF tensors become specgen's (name, stored float32 tensor -> tensor)
FOLDS = {"GemmaForCausalLM": lambda raw, cfg: gemma_norms,
         "Gemma2ForCausalLM": gemma_scalar_fold("self_attn.q_proj.weight"),
         "Gemma3ForCausalLM": gemma_scalar_fold("q_norm.weight"), "GraniteForCausalLM": granite_fold}


# specgen name -> (HF name, GGUF name); "{}" names q, k and v, concatenated along dim 0 into wqkv
TOP_NAMES = {"tok_embeddings.weight": ("model.embed_tokens.weight", "token_embd.weight"),
             "norm.weight": ("model.norm.weight", "output_norm.weight"),
             "output.weight": ("lm_head.weight", "output.weight")}
LAYER_NAMES = {  # under layers.{i}. / model.layers.{i}. / blk.{i}.
    "attention_norm.weight": ("input_layernorm.weight", "attn_norm.weight"),
    "ffn_norm.weight": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "attention.wqkv.weight": ("self_attn.{}_proj.weight", "attn_{}.weight"),
    "attention.wqkv.bias": ("self_attn.{}_proj.bias", "attn_{}.bias"),
    "attention.q_norm.weight": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "attention.k_norm.weight": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    "attention.wo.weight": ("self_attn.o_proj.weight", "attn_output.weight"),
    "feed_forward.w1.weight": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "feed_forward.w3.weight": ("mlp.up_proj.weight", "ffn_up.weight"),
    "feed_forward.w2.weight": ("mlp.down_proj.weight", "ffn_down.weight"),
}
# Gemma's: the feed-forward's input norm under another HF name, each sublayer's output norm; OLMo 2's output norms
# (post_attention_layernorm is the attention's output norm here, as Gemma's, where Llama's is the FFN's input norm)
SANDWICH_NAMES = {
    "ffn_norm.weight": ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    "attention_out_norm.weight": ("post_attention_layernorm.weight", "post_attention_norm.weight"),
    "ffn_out_norm.weight": ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
}
LAYER_PREFIX = {"hf": "model.layers.{i}.", "gguf": "blk.{i}."}
# a routed feed-forward's tensors (cfg.n_experts) under feed_forward.: its router and each expert's ("{e}") gate, up and
# down projections -> (HF name, as Qwen3-MoE's checkpoints and transformers 5's save_pretrained write them, per
# expert; GGUF name, expert e's slice of llama.cpp's [E, out, in] stack: `expert_slices`)
EXPERT_NAMES = {"gate.weight": ("mlp.gate.weight", "ffn_gate_inp.weight"),
                "experts.{e}.w1.weight": ("mlp.experts.{e}.gate_proj.weight", "ffn_gate_exps.weight.{e}"),
                "experts.{e}.w3.weight": ("mlp.experts.{e}.up_proj.weight", "ffn_up_exps.weight.{e}"),
                "experts.{e}.w2.weight": ("mlp.experts.{e}.down_proj.weight", "ffn_down_exps.weight.{e}")}
# Qwen2-MoE's shared expert (cfg.shared_expert_dim) under feed_forward.: its SwiGLU and its gate (dim -> 1) -> (HF name,
# GGUF name: llama.cpp's _shexp tensors, the gate's stored [dim] or [1, dim])
SHARED_EXPERT_NAMES = {"shared_expert.w1.weight": ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
                       "shared_expert.w3.weight": ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
                       "shared_expert.w2.weight": ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
                       "shared_expert_gate.weight": ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight")}
# an architecture -> its checkpoints' name parts for EXPERT_NAMES' (Mixtral's legacy names, which transformers 5 still
# saves), each a part of a tensor under `block_sparse_moe.` -> the part the loader reads
RENAMED = {"MixtralForCausalLM": {"block_sparse_moe.": "mlp.", ".w1.weight": ".gate_proj.weight",
                                  ".w3.weight": ".up_proj.weight", ".w2.weight": ".down_proj.weight"}}


def layer_map(cfg: TransformerConfig, fmt: str) -> dict[str, tuple[str, ...]]:
    """specgen name -> source name(s) in format `fmt` of each parameter the model built from `cfg` has (several are
    concatenated along dim 0: q, k, v -> wqkv)."""
    col = list(LAYER_PREFIX).index(fmt)
    optional = {".output.weight": not cfg.tie_embeddings, ".wqkv.bias": cfg.qkv_bias, ".q_norm.weight": cfg.qk_norm,
                ".k_norm.weight": cfg.qk_norm, ".attention_norm.weight": cfg.pre_norms,
                ".ffn_norm.weight": cfg.pre_norms}

    def names(name: str, prefix: str = "") -> tuple[str, ...]:
        return tuple(prefix + name.format(x) for x in "qkv") if "{}" in name else (prefix + name,)

    out = {ours: names(theirs[col]) for ours, theirs in TOP_NAMES.items()}
    layer_names = LAYER_NAMES | SANDWICH_NAMES if cfg.sandwich_norms else LAYER_NAMES
    if cfg.n_experts:  # the dense projections' places taken by the router's and the experts'
        layer_names = {ours: theirs for ours, theirs in layer_names.items() if not ours.startswith("feed_forward.")}
        layer_names |= {f"feed_forward.{ours.format(e=e)}": tuple(name.format(e=e) for name in theirs)
                        for ours, theirs in EXPERT_NAMES.items() for e in range(cfg.n_experts)}
        layer_names |= {f"feed_forward.{ours}": theirs for ours, theirs in SHARED_EXPERT_NAMES.items()
                        if cfg.shared_expert_dim}
    for i in range(cfg.n_layers):
        out |= {f"layers.{i}.{ours}": names(theirs[col], LAYER_PREFIX[fmt].format(i=i))
                for ours, theirs in layer_names.items()}
    return {ours: theirs for ours, theirs in out.items()
            if all(on for suffix, on in optional.items() if f".{ours}".endswith(suffix))}


def qkv_rows(cfg: TransformerConfig) -> list[int]:
    """The rows of q, k and v in order along dim 0 of a fused projection (wqkv, Phi-3's qkv_proj)."""
    return [cfg.n_heads * cfg.hd] + [cfg.n_kv_heads * cfg.hd] * 2


def remap(cfg: TransformerConfig, names, get: Callable[[str], torch.Tensor | None], fmt: str,
          source: str) -> dict[str, torch.Tensor]:
    """specgen's state dict from the checkpoint's tensors `names`, pulled through `get` (None = absent), each of the
    shape specgen's model for `cfg` gives it (else the entry would break at its first use). A tensor the model would
    ignore (a bias, a norm or a RoPE factor it lacks) is refused: ignoring it would decode silently wrong.
    Precomputed RoPE buffers (`rotary_emb.inv_freq`) and a tied checkpoint's own head copy are ignored as transformers
    ignores them."""
    with torch.device("meta"), random_fills_skipped():  # shapes only: nothing allocated or filled
        shapes = Transformer(cfg).state_dict()
    wanted = layer_map(cfg, fmt)
    known = {t for theirs in wanted.values() for t in theirs}
    extra = sorted(n for n in names if n not in known and not n.endswith("rotary_emb.inv_freq")
                   and not (cfg.tie_embeddings and n in ("lm_head.weight", "output.weight")))
    if extra:
        raise CheckpointError(f"{source} holds tensor {extra[0]}"
                              f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''} that specgen's model for "
                              "its config has no place for; refusing rather than ignoring it (docs/architectures.md)")
    state: dict[str, torch.Tensor] = {}
    for ours, theirs in wanted.items():
        parts = [get(t) for t in theirs]
        if missing := [t for t, p in zip(theirs, parts) if p is None]:
            raise CheckpointError(f"{source} lacks tensor {missing[0]}")
        whole = shapes[ours]  # q, k, v: their rows of wqkv
        for t, p, want in zip(theirs, parts, whole.split(qkv_rows(cfg)) if len(theirs) > 1 else (whole,)):
            if p.shape != want.shape:
                raise CheckpointError(f"{source}: tensor {t} has shape {list(p.shape)}; its config gives "
                                      f"{list(want.shape)}")
        parts = spread_rotary(cfg, ours, parts) if cfg.rope_dim else parts
        state[ours] = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
    return state


def shards(folder: Path) -> list[Path]:
    """The folder's safetensors files: those its `model.safetensors.index.json` lists (each one must be there), else
    every `*.safetensors`. A missing shard is named, where the tensors it held would be reported missing one by one."""
    index = folder / SHARD_INDEX
    if not index.is_file():
        return sorted(folder.glob("*.safetensors"))
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"cannot read {index}: {type(e).__name__} {e}") from None
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{folder} lacks {missing[0]}{more}, which {SHARD_INDEX} lists (an interrupted "
                              "download?): fetch it again")
    return [folder / n for n in names]


def load_hf_folder(folder: Path) -> Loaded:
    """An HF model folder (config.json + *.safetensors, possibly sharded)."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{folder} has no config.json: not an HF model folder")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {cfg_path}: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_path} is not a JSON object")
    try:
        cfg = hf_config(raw)
    except KeyError as e:
        raise CheckpointError(f"{cfg_path} lacks {e.args[0]}") from None
    files = shards(folder)
    if not files:
        raise UsageError(f"{folder} has no .safetensors weights (pickled .bin files are never loaded); where you trust "
                         "the files, transformers converts them: AutoModelForCausalLM.from_pretrained(FOLDER)"
                         ".save_pretrained(NEW, safe_serialization=True)")
    index: dict[str, Path] = {}
    try:
        for f in files:
            with safe_open(str(f), "pt") as h:
                index.update({k: f for k in h.keys()})
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read {f}: {e} (truncated, or not a safetensors file: fetch it again)") from None
    if "lm_head.weight" not in index and not cfg.tie_embeddings:  # transformers would start from a random head
        raise CheckpointError(f"{folder.name} has no lm_head.weight but its config.json sets tie_word_embeddings=false")

    def stored(name: str) -> torch.Tensor | None:
        if name not in index:
            return None
        with safe_open(str(index[name]), "pt") as h:
            return h.get_tensor(name).float()

    arch = (raw.get("architectures") or ["?"])[0]
    names, get = unfused(arch, "hf", cfg, *renamed(arch, set(index), stored), folder.name)
    if arch in FOLDS:
        get = folded(get, FOLDS[arch](raw, cfg))
    if cfg.tie_embeddings and "lm_head.weight" in index and not torch.equal(get("lm_head.weight"),
                                                                            get("model.embed_tokens.weight")):
        # transformers (5.x) does not tie a stored head that differs from the embedding: it uses the stored head
        cfg = dataclasses.replace(cfg, tie_embeddings=False)
    return Loaded(cfg, remap(cfg, names, get, "hf", folder.name), declared_context(raw))


def renamed(arch: str, names: set[str], stored: Callable[[str], torch.Tensor | None]
            ) -> tuple[set[str], Callable[[str], torch.Tensor | None]]:
    """A checkpoint's tensor names and getter with `arch`'s own expert names (`RENAMED`) seen as the loader's."""
    parts = RENAMED.get(arch, {})
    if not parts:
        return names, stored
    first = next(iter(parts))

    def ours(name: str) -> str:
        if first not in name:
            return name
        for theirs, mine in parts.items():
            name = name.replace(theirs, mine)
        return name

    source = {ours(n): n for n in names}
    return set(source), lambda name: stored(source[name]) if name in source else None


def folded(get: Callable[[str], torch.Tensor | None], fold: Callable[[str, torch.Tensor], torch.Tensor]
           ) -> Callable[[str], torch.Tensor | None]:
    """`get` with each tensor it finds passed through `fold` (name, tensor -> tensor)."""
    def fetch(name: str) -> torch.Tensor | None:
        t = get(name)
        return None if t is None else fold(name, t)

    return fetch


def unfused(arch: str, fmt: str, cfg: TransformerConfig, names: set[str], stored: Callable[[str], torch.Tensor | None],
            source: str) -> tuple[set[str], Callable[[str], torch.Tensor | None]]:
    """A checkpoint's tensor names and getter with each fused tensor of `arch` (`FUSED`) seen as the Llama tensors it
    holds: a fused tensor read once for its parts (they are asked one after another), its shape checked against cfg."""
    sizes = {"qkv": qkv_rows(cfg), "up": [cfg.ffn_dim] * 2}
    parts = {}  # a Llama name -> (the fused tensor, its rows' split, the part)
    for i in range(cfg.n_layers):
        prefix = LAYER_PREFIX[fmt].format(i=i)
        parts |= {prefix + ours: (prefix + whole, sizes["qkv" if "qkv" in whole else "up"], part)
                  for ours, (whole, part) in FUSED.get(arch, {}).items() if prefix + whole in names}
    held: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor | None:
        if name not in parts:
            return stored(name)
        whole, split, part = parts[name]
        if whole not in held:
            held.clear()
            held[whole] = stored(whole)
        if held[whole].shape != (sum(split), cfg.dim):  # a fused weight's rows are its parts', its columns the input
            raise CheckpointError(f"{source}: tensor {whole} has shape {list(held[whole].shape)}; its config gives "
                                  f"{[sum(split), cfg.dim]}")
        return held[whole].split(split)[part]

    return {n for n in names if n not in {whole for whole, _, _ in parts.values()}} | set(parts), get
