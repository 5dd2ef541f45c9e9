"""LlamaGen GPTs (c2i, t2i), exactly `Transformer(llamagen_config(...))` under LlamaGen's names: configs, conversion."""

from __future__ import annotations

import re

import torch

from specgen.errors import CheckpointError, UsageError
from specgen.models.llama import LAYER_NAMES, TOP_NAMES
from specgen.models.transformer import TransformerConfig


def find_multiple(n: int, k: int) -> int:
    """Round n up to a multiple of k (LlamaGen's helper)."""
    return n if n % k == 0 else n + k - n % k


# name -> (n_layers, n_heads, dim), as `GPT_models` in LlamaGen's gpt.py; head_dim = dim / n_heads.
GPT_CONFIGS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
    # specgen's embedded tiny image GPT (recipes/tiny/image-gpt.yaml); head_dim 32 (2D RoPE needs % 4 == 0)
    "gpt-tiny": (6, 8, 256),
}


# model_type -> (default cls_token_num, condition field) as LlamaGen's sample_c2i.py / sample_t2i.py call it
MODEL_TYPES: dict[str, tuple[int, str]] = {"c2i": (1, "num_classes"), "t2i": (120, "caption_dim")}


def llamagen_config(name: str, vocab: int = 16384, grid: int = 16, num_classes: int = 1000,
                    cls_token_num: int = 0, rope_base: float = 10000.0, norm_eps: float = 1e-5,
                    model_type: str = "c2i", caption_dim: int = 2048) -> TransformerConfig:
    """The decoder config of LlamaGen model `name` (c2i or t2i) for `vocab` VQ codes on a grid x grid image;
    cls_token_num 0 = the type's default (c2i 1, t2i 120)."""
    if name not in GPT_CONFIGS:
        raise UsageError(f"unknown LlamaGen GPT '{name}'; known: {', '.join(GPT_CONFIGS)}")
    if model_type not in MODEL_TYPES:
        raise UsageError(f"unknown LlamaGen model type '{model_type}'; known: {', '.join(MODEL_TYPES)}")
    default_cls, field = MODEL_TYPES[model_type]
    cls_token_num = cls_token_num or default_cls
    n_layers, n_heads, dim = GPT_CONFIGS[name]
    return TransformerConfig(
        vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_dim=find_multiple(int(2 * 4 * dim / 3), 256), norm_eps=norm_eps, rope_theta=rope_base,
        rope_layout="interleaved", rope_grid=grid, n_cond=cls_token_num, max_seq_len=cls_token_num + grid * grid,
        tie_embeddings=False, **{field: {"num_classes": num_classes, "caption_dim": caption_dim}[field]},
    )


# LlamaGen call-site arguments a "llamagen-gpt" import accepts instead of full TransformerConfig fields
SHORT_KWARGS = ("gpt_model", "model_type", "grid", "vocab_size", "num_classes", "cls_token_num", "caption_dim",
                "rope_base", "norm_eps")


def llamagen_kwargs(kwargs: dict) -> dict:
    """Full `TransformerConfig` fields from builder kwargs: unchanged, or expanded from LlamaGen's call-site form
    `{"gpt_model": "GPT-XL", "model_type": "t2i", "grid": 32, ...}` (grid = image_size / downsample)."""
    if "gpt_model" not in kwargs:
        return kwargs
    if unknown := sorted(set(kwargs) - set(SHORT_KWARGS)):
        raise UsageError(f"llamagen-gpt kwargs: unknown key {unknown[0]!r}; "
                         f"with gpt_model use {', '.join(SHORT_KWARGS)}")
    if "grid" not in kwargs:
        raise UsageError("llamagen-gpt kwargs need 'grid' (image_size / downsample: 16 for 256px, 32 for 512px "
                         "with VQ-16); it is not stored in LlamaGen checkpoints")
    k = dict(kwargs)
    return llamagen_config(k.pop("gpt_model"), vocab=k.pop("vocab_size", 16384), grid=int(k.pop("grid")), **k).to_dict()


_CONTAINERS = ("model", "module", "state_dict")  # DDP, DeepSpeed, Lightning-style; FSDP saves the raw dict
# LANTERN's HF port's names (llama.py's HF column) -> LlamaGen's; its q/k/v rows fuse into wqkv
_HF_TOP = {hf: ours for ours, (hf, _) in TOP_NAMES.items()}
_HF_LAYER = {hf: ours for ours, (hf, _) in LAYER_NAMES.items() if "{}" not in hf}
_HF_KEY = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.([qkv])_proj\.weight|.+)$")


def unwrap(state: dict) -> dict:
    """The flat tensor dict inside a LlamaGen checkpoint container (`model` / `module` / `state_dict` / raw)."""
    while isinstance(state, dict) and (key := next((k for k in _CONTAINERS if isinstance(state.get(k), dict)), None)):
        state = state[key]
    return state


def llamagen_state(state: dict, kwargs: dict | None = None) -> dict[str, torch.Tensor]:
    """Map a LlamaGen (or LANTERN HF) GPT checkpoint onto `Transformer` names, to load strict: containers unwrapped,
    `freqs_cis`, `*.kv_cache.*` and a `_orig_mod.` prefix dropped, HF q/k/v rows concatenated into `wqkv` (LANTERN's
    port keeps LlamaGen's interleaved RoPE: no permutation)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in unwrap(state).items():
        if not isinstance(value, torch.Tensor):
            continue
        key = key.removeprefix("_orig_mod.")
        if key == "freqs_cis" or key.endswith(".freqs_cis") or ".kv_cache." in key:
            continue
        m = _HF_KEY.match(key)
        if m and m[3]:
            qkv.setdefault(m[1], {})[m[3]] = value
            continue
        if m and m[2] in _HF_LAYER:
            key = f"layers.{m[1]}.{_HF_LAYER[m[2]]}"
        out[_HF_TOP.get(key) or re.sub(r"^model\.(?=cls_embedding\.)", "", key)] = value
    for layer, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"layer {layer}: q_proj/k_proj/v_proj incomplete ({', '.join(sorted(parts))})")
        out[f"layers.{layer}.attention.wqkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out
