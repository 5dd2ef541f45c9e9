"""Llama-family weights (Llama, SmolLM2, Qwen2) from HF safetensors folders and GGUF files.

Both loaders return a `TransformerConfig` and a state dict in specgen's parameter names. No weight
permutation is needed: HF checkpoints keep q/k in the `rotate_half` layout ("half"), GGUF llama
files store them in Meta's interleaved layout ("interleaved"), and GGUF qwen2 uses NeoX ("half").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from specgen.errors import CheckpointError, UsageError
from specgen.models.transformer import TransformerConfig

HF_ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}  # name -> qkv bias
GGUF_LAYOUTS = {"llama": "interleaved", "qwen2": "half"}


def hf_config(raw: dict) -> TransformerConfig:
    """TransformerConfig from an HF `config.json` dict."""
    arch = (raw.get("architectures") or ["?"])[0]
    if arch not in HF_ARCHITECTURES:
        raise UsageError(f"unsupported architecture {arch}; supported: {', '.join(HF_ARCHITECTURES)}")
    return TransformerConfig(
        vocab_size=raw["vocab_size"], dim=raw["hidden_size"], n_layers=raw["num_hidden_layers"],
        n_heads=raw["num_attention_heads"], n_kv_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
        ffn_dim=raw["intermediate_size"], head_dim=raw.get("head_dim") or 0, norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(raw.get("rope_theta", 10000.0)), rope_layout="half",
        max_seq_len=min(raw.get("max_position_embeddings", 2048), 8192),
        qkv_bias=HF_ARCHITECTURES[arch], tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


def layer_map(n_layers: int, fmt: str) -> dict[str, tuple[str, ...]]:
    """specgen name -> source name(s) (several are concatenated along dim 0: q, k, v -> wqkv)."""
    names: dict[str, tuple[str, ...]] = {}
    if fmt == "hf":
        names |= {"tok_embeddings.weight": ("model.embed_tokens.weight",), "norm.weight": ("model.norm.weight",),
                  "output.weight": ("lm_head.weight",)}
        per = {"attention_norm.weight": ("input_layernorm.weight",), "ffn_norm.weight": ("post_attention_layernorm.weight",),
               "attention.wqkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
               "attention.wqkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
               "attention.wo.weight": ("self_attn.o_proj.weight",), "feed_forward.w1.weight": ("mlp.gate_proj.weight",),
               "feed_forward.w3.weight": ("mlp.up_proj.weight",), "feed_forward.w2.weight": ("mlp.down_proj.weight",)}
        prefix = "model.layers.{i}."
    else:
        names |= {"tok_embeddings.weight": ("token_embd.weight",), "norm.weight": ("output_norm.weight",),
                  "output.weight": ("output.weight",)}
        per = {"attention_norm.weight": ("attn_norm.weight",), "ffn_norm.weight": ("ffn_norm.weight",),
               "attention.wqkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
               "attention.wqkv.bias": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
               "attention.wo.weight": ("attn_output.weight",), "feed_forward.w1.weight": ("ffn_gate.weight",),
               "feed_forward.w3.weight": ("ffn_up.weight",), "feed_forward.w2.weight": ("ffn_down.weight",)}
        prefix = "blk.{i}."
    for i in range(n_layers):
        for ours, theirs in per.items():
            names[f"layers.{i}.{ours}"] = tuple(prefix.format(i=i) + t for t in theirs)
    return names


def remap(cfg: TransformerConfig, get: Callable[[str], torch.Tensor | None], fmt: str) -> dict[str, torch.Tensor]:
    """Build specgen's state dict by pulling source tensors through `get` (None = absent)."""
    state: dict[str, torch.Tensor] = {}
    for ours, theirs in layer_map(cfg.n_layers, fmt).items():
        if ours == "output.weight" and cfg.tie_embeddings:
            continue
        if ours.endswith("wqkv.bias") and not cfg.qkv_bias:
            continue
        parts = [get(t) for t in theirs]
        if any(p is None for p in parts):
            missing = [t for t, p in zip(theirs, parts) if p is None]
            raise CheckpointError(f"checkpoint lacks tensor {missing[0]}")
        state[ours] = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
    return state


def load_hf_folder(folder: Path) -> tuple[TransformerConfig, dict[str, torch.Tensor]]:
    """An HF model folder (config.json + *.safetensors, possibly sharded)."""
    from safetensors import safe_open

    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{folder} has no config.json: not an HF model folder")
    cfg = hf_config(json.loads(cfg_path.read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UsageError(f"{folder} has no .safetensors weights (pickled .bin files are never loaded)")
    index: dict[str, Path] = {}
    try:
        for f in files:
            with safe_open(str(f), "pt") as h:
                index.update({k: f for k in h.keys()})
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read {f.name}: {e}") from None
    if "lm_head.weight" not in index and not cfg.tie_embeddings:
        cfg = TransformerConfig(**{**cfg.to_dict(), "tie_embeddings": True})

    def get(name: str) -> torch.Tensor | None:
        if name not in index:
            return None
        with safe_open(str(index[name]), "pt") as h:
            return h.get_tensor(name).float()

    return cfg, remap(cfg, get, "hf")


def gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def load_gguf(path: Path, progress: Callable[[int, int], None] | None = None) -> tuple[TransformerConfig, dict[str, torch.Tensor]]:
    """A GGUF file (any quantisation the `gguf` package can dequantise) as float32 weights."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
        arch = gguf_field(reader, "general.architecture")
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise CheckpointError(f"cannot parse GGUF file {path}: {e}") from None
    if arch not in GGUF_LAYOUTS:
        raise UsageError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_LAYOUTS)}")
    tensors = {t.name: t for t in reader.tensors}
    n_heads = gguf_field(reader, f"{arch}.attention.head_count")
    cfg = TransformerConfig(
        vocab_size=int(tensors["token_embd.weight"].shape[-1]), dim=gguf_field(reader, f"{arch}.embedding_length"),
        n_layers=gguf_field(reader, f"{arch}.block_count"), n_heads=n_heads,
        n_kv_heads=gguf_field(reader, f"{arch}.attention.head_count_kv", n_heads),
        ffn_dim=gguf_field(reader, f"{arch}.feed_forward_length"),
        norm_eps=float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)), rope_layout=GGUF_LAYOUTS[arch],
        max_seq_len=min(int(gguf_field(reader, f"{arch}.context_length", 2048)), 8192),
        qkv_bias="blk.0.attn_q.bias" in tensors, tie_embeddings="output.weight" not in tensors,
    )
    done = [0]

    def get(name: str) -> torch.Tensor | None:
        t = tensors.get(name)
        if t is None:
            return None
        data = dequantize(t.data, t.tensor_type)
        done[0] += 1
        if progress:
            progress(done[0], len(tensors))
        return torch.from_numpy(data.copy()).float()

    return cfg, remap(cfg, get, "gguf")
